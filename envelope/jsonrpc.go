package envelope

import (
	"encoding/json"
	"strconv"
)

// DefaultMaxBatch bounds the elements of one JSON-RPC batch.
const DefaultMaxBatch = 1000

// RPCCall is one request of a decoded JSON-RPC 2.0 message.
//
// ID holds the id exactly as sent (string, number or null; never
// re-encoded, so large numbers keep their precision). A notification has
// no id and gets no response, even on error. Err is set when the element is
// not a valid request: it is answered with Err and ID (null when the id
// could not be read).
type RPCCall struct {
	ID           json.RawMessage
	Notification bool
	Request      Request
	Err          *Error
}

var nullID = json.RawMessage("null")

// DecodeJSONRPC decodes a JSON-RPC 2.0 message: one request or a batch. A
// non-nil error means the message as a whole is refused (not JSON, over a
// limit, an empty batch) and is answered by one error object with id null.
// Otherwise calls holds one entry per request, each either valid or
// carrying its own Err. batch reports whether the message is an array,
// refused or not (a refused one is not scanned again to tell whether it
// was valid JSON past the point of refusal). Raw fields alias data.
func DecodeJSONRPC(data []byte, lim Limits) (calls []RPCCall, batch bool, err *Error) {
	if err := PrecheckJSONRPC(data, lim); err != nil {
		i := skipSpace(data, 0)
		return nil, i < len(data) && data[i] == '[', err
	}
	calls, batch = DecodeCheckedJSONRPC(data)
	return calls, batch, nil
}

// DecodeCheckedJSONRPC is DecodeJSONRPC for a message that has already
// passed PrecheckJSONRPC with the same limits (a reader checks each
// message in its read buffer): it decodes without scanning the message a
// second time.
func DecodeCheckedJSONRPC(data []byte) (calls []RPCCall, batch bool) {
	if c, ok := DecodeCheckedJSONRPCSingle(data); ok {
		return []RPCCall{c}, false
	}
	data = trimValue(data)
	n := 0
	eachElement(data, func([]byte) { n++ })
	calls = make([]RPCCall, 0, n)
	eachElement(data, func(v []byte) { calls = append(calls, decodeRPCRequest(v)) })
	return calls, true
}

// DecodeCheckedJSONRPCSingle is DecodeCheckedJSONRPC for a message that
// is one call, not a batch: the call, with no slice to hold it; ok is
// false for a batch (an array), which DecodeCheckedJSONRPC decodes.
func DecodeCheckedJSONRPCSingle(data []byte) (c RPCCall, ok bool) {
	data = trimValue(data)
	if data[0] == '[' {
		return RPCCall{}, false
	}
	return decodeRPCRequest(data), true
}

func decodeRPCRequest(v []byte) RPCCall {
	var c RPCCall
	if kindOf(v) != '{' {
		c.ID = nullID
		c.Err = NewError(CodeInvalidRequest, "a request must be a JSON object")
		return c
	}
	var version string
	var hasID, hasVersion, hasMethod bool
	var badID *Error
	r := &c.Request
	err := eachMember(v, func(key string, v []byte) *Error {
		var e *Error
		switch key {
		case "jsonrpc":
			hasVersion = true
			version, e = internField("jsonrpc", v)
		case "id":
			hasID = true
			switch kindOf(v) {
			case '"', '0', 'n':
				c.ID = json.RawMessage(v)
			default:
				badID = NewError(CodeInvalidRequest, "id must be a string, a number or null")
			}
		case "method":
			hasMethod = true
			r.Method, e = internField("method", v)
		case "params":
			switch kindOf(v) {
			case '{', '[':
				r.Params = json.RawMessage(v)
			default:
				e = NewError(CodeInvalidRequest, "params must be an object or an array")
			}
		case "meta":
			e = decodeMeta(v, r)
		}
		return e
	})
	switch {
	case badID != nil:
		c.ID, c.Err = nullID, badID
		return c
	case err != nil:
		c.Err = err
	case !hasVersion || version != "2.0":
		c.Err = NewError(CodeInvalidRequest, `jsonrpc must be exactly "2.0"`)
	case !hasMethod || r.Method == "":
		c.Err = NewError(CodeInvalidRequest, "method is missing")
	}
	if !hasID {
		if c.Err != nil {
			// An invalid object is answered even without an id: nothing
			// proves that its sender meant a notification.
			c.ID = nullID
			return c
		}
		c.Notification = true
	}
	return c
}

// decodeMeta reads the optional top-level "meta" member: the envelope
// headers, plus "destination" and "origin".
func decodeMeta(v []byte, r *Request) *Error {
	if kindOf(v) != '{' {
		return NewError(CodeInvalidRequest, "meta must be an object")
	}
	var hdr []byte
	err := eachMember(v, func(key string, v []byte) *Error {
		var e *Error
		switch key {
		case "destination":
			r.Destination, e = stringField("meta.destination", v)
		case "origin":
			r.Origin, e = stringField("meta.origin", v)
		case "id":
			r.ID, e = stringField("meta.id", v)
		default:
			hdr = v // headers are read below from the whole object
		}
		return e
	})
	if err != nil {
		return err
	}
	if hdr != nil {
		return decodeHeaders(v, &r.Headers)
	}
	return nil
}

// AppendJSONRPCRequest appends a JSON-RPC 2.0 request for r. A nil id makes
// a notification. Headers go in "meta" when any is set.
func AppendJSONRPCRequest(b []byte, id json.RawMessage, r *Request) []byte {
	b = append(b, `{"jsonrpc":"2.0"`...)
	if id != nil {
		b = append(b, `,"id":`...)
		b = append(b, id...)
	}
	b = append(b, `,"method":`...)
	b = appendString(b, r.Method)
	if len(r.Params) > 0 {
		b = append(b, `,"params":`...)
		b = append(b, r.Params...)
	}
	if r.Headers != (Headers{}) || r.Destination != "" || r.ID != "" {
		b = append(b, `,"meta":`...)
		h := appendHeaders(nil, &r.Headers)
		b = append(b, h[:len(h)-1]...)
		sep := len(h) > 2
		for _, kv := range [...][2]string{{"destination", r.Destination}, {"origin", r.Origin}, {"id", r.ID}} {
			if kv[1] == "" {
				continue
			}
			if sep {
				b = append(b, ',')
			}
			sep = true
			b = append(b, '"')
			b = append(b, kv[0]...)
			b = append(b, '"', ':')
			b = appendString(b, kv[1])
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// AppendJSONRPCResult appends a JSON-RPC 2.0 success response.
func AppendJSONRPCResult(b []byte, id, result json.RawMessage) []byte {
	b = append(b, `{"jsonrpc":"2.0","result":`...)
	if len(result) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, result...)
	}
	b = append(b, `,"id":`...)
	b = appendID(b, id)
	return append(b, '}')
}

// AppendJSONRPCError appends a JSON-RPC 2.0 error response. The five codes
// of the specification keep its standard messages ("Method not found");
// the mesh's own message then goes in data.detail. data also carries the
// symbolic code, the HTTP status and whether a retry may help.
func AppendJSONRPCError(b []byte, id json.RawMessage, e *Error) []byte {
	b = append(b, `{"jsonrpc":"2.0","error":{"code":`...)
	b = strconv.AppendInt(b, int64(e.Code.JSONRPC()), 10)
	msg, detail := e.Message, ""
	if std := e.Code.row().std; std != "" {
		msg, detail = std, e.Message
	}
	if msg == "" {
		msg = e.Code.String()
	}
	b = append(b, `,"message":`...)
	b = appendString(b, msg)
	b = append(b, `,"data":{`...)
	b = appendErrorBody(b, e)
	if detail != "" && detail != msg {
		b = append(b, `,"detail":`...)
		b = appendString(b, detail)
	}
	b = append(b, `}},"id":`...)
	b = appendID(b, id)
	return append(b, '}')
}

func appendID(b []byte, id json.RawMessage) []byte {
	if len(id) == 0 {
		return append(b, "null"...)
	}
	return append(b, id...)
}

// RPCReply is one decoded JSON-RPC 2.0 response.
type RPCReply struct {
	ID     json.RawMessage
	Result json.RawMessage // set on success
	Err    *Error          // set on failure, marked as a wire error
}

// DecodeJSONRPCResponse decodes a single JSON-RPC 2.0 response. The mesh's
// symbolic code in error.data wins over the number; data.detail, when
// present, restores the mesh's own message.
func DecodeJSONRPCResponse(data []byte, lim Limits) (RPCReply, *Error) {
	var r RPCReply
	if err := lim.check(data); err != nil {
		return r, err
	}
	var errObj []byte
	var hasResult bool
	err := eachMember(data, func(key string, v []byte) *Error {
		switch key {
		case "id":
			r.ID = json.RawMessage(v)
		case "result":
			hasResult = true
			r.Result = json.RawMessage(v)
		case "error":
			errObj = v
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	if errObj == nil || kindOf(errObj) == 'n' {
		if !hasResult {
			return r, NewError(CodeInvalidRequest, "response has neither result nor error")
		}
		return r, nil
	}
	if kindOf(errObj) != '{' {
		return r, NewError(CodeInvalidRequest, "error must be an object")
	}
	var num, attempts int64
	var msg, detail, sym string
	var details json.RawMessage
	var notSent bool
	err = eachMember(errObj, func(key string, v []byte) *Error {
		var e *Error
		switch key {
		case "code":
			num, e = intField("error.code", v, -1<<31, 1<<31-1)
		case "message":
			msg, e = stringField("error.message", v)
		case "data":
			if kindOf(v) != '{' {
				details = json.RawMessage(v)
				return nil
			}
			return eachMember(v, func(key string, v []byte) *Error {
				switch key {
				case "code":
					if kindOf(v) == '"' {
						sym, _ = unquote(v)
					}
				case "detail":
					if kindOf(v) == '"' {
						detail, _ = unquote(v)
					}
				case "details":
					details = json.RawMessage(v)
				case "notSent":
					notSent = kindOf(v) == 't'
				case "attempts":
					attempts, _ = intField("error.data.attempts", v, 0, 1<<20)
				}
				return nil
			})
		}
		return e
	})
	if err != nil {
		return r, err
	}
	c, ok := ParseCode(sym)
	if !ok || c == CodeOK {
		c, _ = CodeFromJSONRPC(int(num))
	}
	if detail != "" {
		msg = detail
	}
	r.Err = WireError(c, msg, details)
	r.Err.notSent, r.Err.attempts = notSent, int(attempts)
	return r, nil
}
