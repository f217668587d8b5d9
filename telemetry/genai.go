package telemetry

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/envelope"
)

// Agent work in the trace, after the OpenTelemetry GenAI semantic
// conventions (gen-ai-spans, gen-ai-agent-spans, gen-ai-metrics; status
// "development"). A chat turn is an INTERNAL span "invoke_agent {agent}"
// under the RPC that asked for it (the agent's SERVER span for
// chat.send); under the turn, each model call is a CLIENT span
// "chat {model}", each tool execution an INTERNAL span
// "execute_tool {tool}" (a mesh_call's routed call hangs under it), and
// each compaction an INTERNAL span "compact {agent}". A tool span links
// to the model call that asked for it: the tool runs after that call
// ended, so it is its sibling under the turn, not its child.
//
// The Go semconv packages after v1.37.0 leave the gen_ai namespace out
// (it is still in development), so its keys are spelled here.

// GenAI operation names (gen_ai.operation.name).
const (
	GenAIChat        = "chat"
	GenAIInvokeAgent = "invoke_agent"
	GenAIExecuteTool = "execute_tool"
)

// GenAI token types (gen_ai.token.type).
const (
	GenAITokenInput  = "input"
	GenAITokenOutput = "output"
)

var (
	keyGenAIOperation      = attribute.Key("gen_ai.operation.name")
	keyGenAIProvider       = attribute.Key("gen_ai.provider.name")
	keyGenAIRequestModel   = attribute.Key("gen_ai.request.model")
	keyGenAIResponseModel  = attribute.Key("gen_ai.response.model")
	keyGenAIInputTokens    = attribute.Key("gen_ai.usage.input_tokens")
	keyGenAIOutputTokens   = attribute.Key("gen_ai.usage.output_tokens")
	keyGenAIFinishReasons  = attribute.Key("gen_ai.response.finish_reasons")
	keyGenAIAgentID        = attribute.Key("gen_ai.agent.id")
	keyGenAIAgentName      = attribute.Key("gen_ai.agent.name")
	keyGenAIConversationID = attribute.Key("gen_ai.conversation.id")
	keyGenAIToolName       = attribute.Key("gen_ai.tool.name")
	keyGenAIToolCallID     = attribute.Key("gen_ai.tool.call.id")
	// The mesh's own: the chat.send request a turn serves, and a
	// compaction's figures (tokens of the whole context: system, tools,
	// summary and messages).
	keyChatRequestID        = attribute.Key("agentmesh.chat.request_id")
	keyCompactionReason     = attribute.Key("agentmesh.compaction.reason")
	keyCompactionTokensPre  = attribute.Key("agentmesh.compaction.tokens_before")
	keyCompactionTokensPost = attribute.Key("agentmesh.compaction.tokens_after")
	keyCompactionRemoved    = attribute.Key("agentmesh.compaction.messages_removed")
	keyCompactionKept       = attribute.Key("agentmesh.compaction.messages_kept")
)

// The GenAI metrics (gen_ai.client.token.usage and
// gen_ai.client.operation.duration), as Prometheus names them.
const (
	GenAITokenUsageMetric = "gen_ai_client_token_usage"
	GenAIDurationMetric   = "gen_ai_client_operation_duration_seconds"

	labelGenAIOperation = "gen_ai_operation_name"
	labelGenAIProvider  = "gen_ai_provider_name"
	labelGenAIModel     = "gen_ai_request_model"
	labelGenAITokenType = "gen_ai_token_type"
	labelErrorType      = "error_type" // error.type: "" on success
)

// GenAIMetricNames lists the GenAI metrics' names (Metrics.Names lists the
// mesh's own collectors; these are registered by NewGenAI).
var GenAIMetricNames = []string{GenAITokenUsageMetric, GenAIDurationMetric}

// The semconv's advisory buckets: tokens by powers of 4 from 1 to 64 Mi,
// seconds doubling from 10 ms to 81.92 s.
var (
	GenAITokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	GenAIDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
)

// genAIScope is the instrumentation scope of spans made with a parent's
// provider (the same name New gives its tracer).
const genAIScope = "github.com/agentmesh/agentmesh"

// GenAI instruments an agent runtime's generative-AI work: spans, and the
// token usage and model call duration histograms. A nil *GenAI does
// nothing. Safe for concurrent use.
type GenAI struct {
	tracer   trace.Tracer             // nil: spans only under a recording parent, with the parent's provider
	tokens   *prometheus.HistogramVec // nil: no metrics
	duration *prometheus.HistogramVec
}

// NewGenAI returns the GenAI instrumentation of t: spans from t's tracer
// when t traces, else under a recording parent span only, made with that
// span's provider (so that a runtime served by a traced agent is traced
// with it); the two histograms on t.M's registry when t has metrics
// (registered once per registry: runtimes sharing a Metrics share them).
// t may be nil.
func NewGenAI(t *Telemetry) *GenAI {
	g := &GenAI{}
	if t.Tracing() {
		g.tracer = t.tracer
	}
	if t != nil && t.M != nil {
		ops := []string{labelGenAIOperation, labelGenAIProvider, labelGenAIModel}
		g.tokens = registerHistogram(t.M.Registry, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: GenAITokenUsageMetric, Help: "Tokens used by model calls, by token type (OTel gen_ai.client.token.usage, unit {token}).",
			Buckets: GenAITokenBuckets, NativeHistogramBucketFactor: 1.1,
		}, append(ops, labelGenAITokenType)))
		g.duration = registerHistogram(t.M.Registry, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: GenAIDurationMetric, Help: "Duration of model calls, streamed to their end (OTel gen_ai.client.operation.duration); error_type is empty on success.",
			Buckets: GenAIDurationBuckets, NativeHistogramBucketFactor: 1.1,
		}, append(ops, labelErrorType)))
	}
	return g
}

// registerHistogram registers h on reg, or returns the histogram of the
// same name registered there before.
func registerHistogram(reg *prometheus.Registry, h *prometheus.HistogramVec) *prometheus.HistogramVec {
	if err := reg.Register(h); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(*prometheus.HistogramVec); ok {
				return old
			}
		}
		panic(err)
	}
	return h
}

// InitModel shows the series of a provider's model at 0 before its first
// call (a dashboard then shows 0, not "No data"): token usage of both
// types, and the duration of successful calls.
func (g *GenAI) InitModel(operation, provider, model string) {
	if g == nil || g.tokens == nil {
		return
	}
	g.tokens.WithLabelValues(operation, provider, model, GenAITokenInput)
	g.tokens.WithLabelValues(operation, provider, model, GenAITokenOutput)
	g.duration.WithLabelValues(operation, provider, model, "")
}

// tracerFor is the tracer of a span under ctx; nil: no span (callers
// then build neither its name nor its attributes). Under a span that is
// not sampled, none: its children would hang in a trace whose root is
// never exported, and an unsampled call costs next to nothing. Else g's
// tracer, or, without one, the provider's of the span in ctx when that
// one records.
func (g *GenAI) tracerFor(ctx context.Context) trace.Tracer {
	if g == nil {
		return nil
	}
	parent := trace.SpanFromContext(ctx)
	if sc := parent.SpanContext(); sc.IsValid() && !sc.IsSampled() {
		return nil
	}
	if g.tracer != nil {
		return g.tracer
	}
	if parent.IsRecording() {
		return parent.TracerProvider().Tracer(genAIScope)
	}
	return nil
}

// ErrorType is the error.type of err: its mesh code in snake case
// ("cancelled", "timeout", "rpc_error", ...), "" for nil.
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	return strings.ToLower(envelope.CodeOf(err).String())
}

// genAIFail marks span failed with errType (error.type) and msg.
func genAIFail(span trace.Span, errType, msg string) {
	if len(msg) > 256 {
		msg = strings.ToValidUTF8(msg[:256], "") + "…"
	}
	span.SetAttributes(keyErrorType.String(errType))
	span.SetStatus(codes.Error, msg)
}

// GenAIAgent describes an agent's turn (an invoke_agent span).
type GenAIAgent struct {
	Name, ID       string // gen_ai.agent.name, gen_ai.agent.id
	ConversationID string // gen_ai.conversation.id
	Provider       string // gen_ai.provider.name of its model calls
	RequestModel   string // gen_ai.request.model, when known ahead
	RequestID      string // agentmesh.chat.request_id: the send the turn serves
}

// AgentTurn is a turn StartInvokeAgent began: End it once.
type AgentTurn struct {
	span            trace.Span
	input, output   int
	usage           bool
	model, response string
}

// StartInvokeAgent starts the span of an agent's turn,
// "invoke_agent {name}" (INTERNAL: the agent runs in this process).
func (g *GenAI) StartInvokeAgent(ctx context.Context, a GenAIAgent) (context.Context, AgentTurn) {
	tr := g.tracerFor(ctx)
	if tr == nil {
		return ctx, AgentTurn{}
	}
	ctx, span := tr.Start(ctx, GenAIInvokeAgent+" "+a.Name, trace.WithSpanKind(trace.SpanKindInternal))
	if span.IsRecording() {
		kv := []attribute.KeyValue{
			keyGenAIOperation.String(GenAIInvokeAgent), keyGenAIAgentName.String(a.Name), keyGenAIAgentID.String(a.ID),
			keyGenAIConversationID.String(a.ConversationID), keyGenAIProvider.String(a.Provider), keyChatRequestID.String(a.RequestID),
		}
		if a.RequestModel != "" {
			kv = append(kv, keyGenAIRequestModel.String(a.RequestModel))
		}
		span.SetAttributes(kv...)
	}
	return ctx, AgentTurn{span: span, model: a.RequestModel}
}

// Recording reports whether the turn's span records.
func (t *AgentTurn) Recording() bool { return t.span != nil && t.span.IsRecording() }

// Add counts a model call's answer in the turn's totals: its tokens, its
// model.
func (t *AgentTurn) Add(r *ModelResult) {
	if r.Usage {
		t.usage = true
		t.input += r.InputTokens
		t.output += r.OutputTokens
	}
	if r.ResponseModel != "" {
		t.response = r.ResponseModel
	}
}

// End ends the turn: its token totals over its model calls, the model
// that answered last, and err's type and text when it failed.
func (t *AgentTurn) End(err error) {
	if t.span == nil {
		return
	}
	if t.span.IsRecording() {
		if t.usage {
			t.span.SetAttributes(keyGenAIInputTokens.Int(t.input), keyGenAIOutputTokens.Int(t.output))
		}
		if t.response != "" {
			t.span.SetAttributes(keyGenAIResponseModel.String(t.response))
			if t.model == "" {
				t.span.SetAttributes(keyGenAIRequestModel.String(t.response))
			}
		}
		if err != nil {
			genAIFail(t.span, ErrorType(err), err.Error())
		}
	}
	t.span.End()
}

// ModelCall is a model call StartChat began: End it once.
type ModelCall struct {
	g        *GenAI
	span     trace.Span
	start    time.Time
	provider string
	model    string
}

// ModelResult is what a model call answered.
type ModelResult struct {
	ResponseModel             string // gen_ai.response.model
	Usage                     bool   // the provider reported usage
	InputTokens, OutputTokens int
	FinishReason              string // gen_ai.response.finish_reasons[0] (the provider's stop reason)
}

// StartChat starts a model call to provider's requestModel: the CLIENT span "chat {model}" (just "chat" while the
// model is unknown: End names it after the model that answered) and the
// clock of gen_ai_client_operation_duration_seconds.
func (g *GenAI) StartChat(ctx context.Context, provider, requestModel string) (context.Context, ModelCall) {
	if g == nil {
		return ctx, ModelCall{}
	}
	c := ModelCall{g: g, start: time.Now(), provider: provider, model: requestModel}
	tr := g.tracerFor(ctx)
	if tr == nil {
		return ctx, c
	}
	name := GenAIChat
	if requestModel != "" {
		name += " " + requestModel
	}
	ctx, span := tr.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		kv := []attribute.KeyValue{keyGenAIOperation.String(GenAIChat), keyGenAIProvider.String(provider)}
		if requestModel != "" {
			kv = append(kv, keyGenAIRequestModel.String(requestModel))
		}
		span.SetAttributes(kv...)
	}
	c.span = span
	return ctx, c
}

// SpanContext is the call's span context (invalid without a span): a
// tool span links to the call that asked for the tool.
func (c *ModelCall) SpanContext() trace.SpanContext {
	if c.span == nil {
		return trace.SpanContext{}
	}
	return c.span.SpanContext()
}

// End ends the call with what it answered, or err: the span's usage,
// model and finish reason, the duration and token histograms (the turn's
// totals are AgentTurn.Add's). A provider that does not say its model ahead gets the
// answering model as its request model.
func (c *ModelCall) End(r ModelResult, err error) {
	if c.g == nil {
		return
	}
	g, span, provider, model := c.g, c.span, c.provider, c.model
	d := time.Since(c.start)
	if model == "" {
		model = r.ResponseModel
	}
	if span != nil && span.IsRecording() {
		if c.model == "" && model != "" {
			span.SetName(GenAIChat + " " + model)
			span.SetAttributes(keyGenAIRequestModel.String(model))
		}
		if err != nil {
			genAIFail(span, ErrorType(err), err.Error())
		} else {
			kv := make([]attribute.KeyValue, 0, 4)
			if r.ResponseModel != "" {
				kv = append(kv, keyGenAIResponseModel.String(r.ResponseModel))
			}
			if r.Usage {
				kv = append(kv, keyGenAIInputTokens.Int(r.InputTokens), keyGenAIOutputTokens.Int(r.OutputTokens))
			}
			if r.FinishReason != "" {
				kv = append(kv, keyGenAIFinishReasons.StringSlice([]string{r.FinishReason}))
			}
			span.SetAttributes(kv...)
		}
	}
	if g.duration != nil {
		genAIObserve(g.duration.WithLabelValues(GenAIChat, provider, model, ErrorType(err)), d.Seconds(), span)
		if err == nil && r.Usage {
			genAIObserve(g.tokens.WithLabelValues(GenAIChat, provider, model, GenAITokenInput), float64(r.InputTokens), span)
			genAIObserve(g.tokens.WithLabelValues(GenAIChat, provider, model, GenAITokenOutput), float64(r.OutputTokens), span)
		}
	}
	if span != nil {
		span.End()
	}
}

// genAIObserve records v on o, with the span's trace and span ids as an
// exemplar when the span is sampled.
func genAIObserve(o prometheus.Observer, v float64, span trace.Span) {
	if span != nil {
		if sc := span.SpanContext(); sc.IsSampled() {
			if eo, ok := o.(prometheus.ExemplarObserver); ok {
				eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()})
				return
			}
		}
	}
	o.Observe(v)
}

// ToolRun is a tool execution StartTool began: End it once.
type ToolRun struct{ span trace.Span }

// StartTool starts the INTERNAL span "execute_tool {name}" of the tool
// call callID, linked to the model call that asked for it (from, when
// valid). A tool that calls the mesh must call it with the returned ctx:
// its routed call is then the span's child.
func (g *GenAI) StartTool(ctx context.Context, name, callID string, from trace.SpanContext) (context.Context, ToolRun) {
	tr := g.tracerFor(ctx)
	if tr == nil {
		return ctx, ToolRun{}
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	if from.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: from}))
	}
	ctx, span := tr.Start(ctx, GenAIExecuteTool+" "+name, opts...)
	if span.IsRecording() {
		span.SetAttributes(keyGenAIOperation.String(GenAIExecuteTool), keyGenAIToolName.String(name), keyGenAIToolCallID.String(callID))
	}
	return ctx, ToolRun{span}
}

// End ends the tool's span: failed with errType (error.type) and msg
// when errType is not "".
func (t *ToolRun) End(errType, msg string) {
	if t.span == nil {
		return
	}
	if errType != "" && t.span.IsRecording() {
		genAIFail(t.span, errType, msg)
	}
	t.span.End()
}

// Compaction is what a compaction did.
type Compaction struct {
	Reason                    string // count, tokens or summary
	TokensBefore, TokensAfter int    // the context's estimated tokens
	Removed, Kept             int    // messages
}

// CompactionRun is a compaction StartCompaction began: End it once.
type CompactionRun struct{ span trace.Span }

// StartCompaction starts the INTERNAL span "compact {agent}".
func (g *GenAI) StartCompaction(ctx context.Context, agent string) (context.Context, CompactionRun) {
	tr := g.tracerFor(ctx)
	if tr == nil {
		return ctx, CompactionRun{}
	}
	ctx, span := tr.Start(ctx, "compact "+agent, trace.WithSpanKind(trace.SpanKindInternal))
	if span.IsRecording() {
		span.SetAttributes(keyGenAIAgentID.String(agent))
	}
	return ctx, CompactionRun{span}
}

// Recording reports whether the compaction's span records (its figures
// are worth computing).
func (c *CompactionRun) Recording() bool { return c.span != nil && c.span.IsRecording() }

// End ends the compaction's span with its figures, or err.
func (c *CompactionRun) End(r Compaction, err error) {
	if c.span == nil {
		return
	}
	if c.span.IsRecording() {
		c.span.SetAttributes(keyCompactionReason.String(r.Reason), keyCompactionTokensPre.Int(r.TokensBefore),
			keyCompactionTokensPost.Int(r.TokensAfter), keyCompactionRemoved.Int(r.Removed), keyCompactionKept.Int(r.Kept))
		if err != nil {
			genAIFail(c.span, ErrorType(err), err.Error())
		}
	}
	c.span.End()
}
