package telemetry

import (
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/agentmesh/agentmesh/envelope"
)

// Every attribute key and metric label the mesh emits lives in this file,
// so that the coming rename of rpc.response.status_code to rpc.status_code
// (semconv main) is a one-line change.

// System is the rpc.system.name of the native envelope (a custom value,
// which the conventions allow); JSON-RPC requests use "jsonrpc".
const (
	System        = "agentmesh"
	SystemJSONRPC = "jsonrpc"
)

// OtherMethod stands for a method the mesh does not know, in span names,
// attributes and metric labels, so that callers cannot blow up cardinality.
const OtherMethod = "_OTHER"

var (
	keySystem         = semconv.RPCSystemNameKey
	keyMethod         = semconv.RPCMethodKey
	keyMethodOriginal = semconv.RPCMethodOriginalKey
	keyStatusCode     = attribute.Key("rpc.response.status_code")
	keyErrorType      = semconv.ErrorTypeKey
	keyRequestID      = attribute.Key("agentmesh.request.id")
	keyAttempt        = attribute.Key("agentmesh.attempt")
	keyInstance       = attribute.Key("agentmesh.instance")
	keyCode           = attribute.Key("agentmesh.error.code")
	keyNotSent        = attribute.Key("agentmesh.error.not_sent")
	keyTTL            = attribute.Key("agentmesh.ttl_ms") // the ttl header a server received
	keyServerAddress  = semconv.ServerAddressKey
	keyServerPort     = semconv.ServerPortKey
	keyPeerAddress    = semconv.NetworkPeerAddressKey
	keyPeerPort       = semconv.NetworkPeerPortKey
	// A retry's reason and backoff, on its attempt span's "retry" event.
	keyRetryReason  = attribute.Key("agentmesh.retry.reason")
	keyRetryBackoff = attribute.Key("agentmesh.retry.backoff_ms")
	// A stream's figures, on its server span (EndStream).
	keyStreamChunks     = attribute.Key("agentmesh.stream.chunks")
	keyStreamBytes      = attribute.Key("agentmesh.stream.bytes")
	keyStreamFirstChunk = attribute.Key("agentmesh.stream.first_chunk_ms")
	keyStreamStalls     = attribute.Key("agentmesh.stream.stalls")
)

// Prometheus label names: the OTel names, translated.
const (
	labelSystem = "rpc_system_name"
	labelMethod = "rpc_method"
	labelStatus = "rpc_response_status_code"
)

// statusCode is the numeric JSON-RPC code as a string ("" on success).
func statusCode(c envelope.Code) string {
	if c == envelope.CodeOK {
		return ""
	}
	return strconv.Itoa(c.JSONRPC())
}

// InstanceAttr names the instance an attempt went to.
func InstanceAttr(id string) attribute.KeyValue { return keyInstance.String(id) }
