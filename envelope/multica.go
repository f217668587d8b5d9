package envelope

import (
	"encoding/json"
)

// MulticaMessage is a decoded Multica RoutedMessage {id, uid, from, to,
// action, payload} (seeds multica-hub-rpc and multica-client-streaming).
type MulticaMessage struct {
	ID      string
	UID     json.RawMessage // a JSON string as sent, or nil for null or absent
	From    string
	To      string
	Action  string
	Payload json.RawMessage // any JSON as sent, or nil when absent
}

// MulticaMaxID bounds a Multica message's ids, device ids and requestIds,
// in bytes.
const MulticaMaxID = 256

// DecodeMulticaMessage decodes one RoutedMessage within lim, in one pass.
// id, from and uid are optional (id and from may be null; uid is a string
// or null), to and action are required non-empty strings; strings are at
// most MulticaMaxID bytes. A message without an id gets a new one
// (NewID). payload is not read: it is routed as sent, or read by
// DecodeCheckedMulticaRequest for a request to the hub.
//
// Refusals: over a limit, not an object or a key given twice is
// INVALID_REQUEST; not JSON or not UTF-8 is PARSE_ERROR (a browser
// receiving invalid UTF-8 in a text frame would drop its connection); a
// member absent or of the wrong type is INVALID_PARAMS (ErrMissing is the
// cause of an absent one). On a refusal the message is returned as far as
// it was read (its id and uid, to answer with), or nil; a message refused
// for a key given twice keeps its id and uid when they were each given
// once.
func DecodeMulticaMessage(data []byte, lim Limits) (*MulticaMessage, *Error) {
	if err := lim.check(data); err != nil {
		return nil, err
	}
	if kindOf(trimValue(data)) != '{' {
		return nil, NewError(CodeInvalidRequest, "a message must be a JSON object: {id, uid, from, to, action, payload}")
	}
	var id, uid, from, to, action, payload []byte
	err := eachMember(data, func(key string, v []byte) *Error {
		switch key {
		case "id":
			id = v
		case "uid":
			uid = v
		case "from":
			from = v
		case "to":
			to = v
		case "action":
			action = v
		case "payload":
			payload = v
		}
		return nil
	})
	if err != nil {
		m := &MulticaMessage{}
		v, found := recoverStrings(data, "id", "uid")
		if found[0] && len(v[0]) <= MulticaMaxID {
			m.ID = v[0]
		}
		if found[1] {
			m.UID = json.RawMessage(appendString(nil, v[1]))
		}
		return m, err
	}
	m := &MulticaMessage{}
	if m.ID, err = multicaString("id", id, false, false); err != nil {
		return m, err
	}
	if m.ID == "" {
		m.ID = NewID()
	}
	switch kindOf(uid) {
	case 0, 'n':
	case '"':
		if _, ok := unquote(uid); !ok {
			return m, NewError(CodeInvalidParams, "uid must be a string or null")
		}
		m.UID = uid
	default:
		return m, NewError(CodeInvalidParams, "uid must be a string or null")
	}
	if m.From, err = multicaString("from", from, false, true); err != nil {
		return m, err
	}
	if m.To, err = multicaString("to", to, true, true); err != nil {
		return m, err
	}
	if m.Action, err = multicaString("action", action, true, true); err != nil {
		return m, err
	}
	m.Payload = payload
	return m, nil
}

// multicaString reads a string member of at most MulticaMaxID bytes:
// absent or null is "" (refused when required, as is ""). Device ids and
// actions, which repeat, are interned; message ids, which do not, are not.
func multicaString(name string, v []byte, required, intern bool) (string, *Error) {
	if v == nil || kindOf(v) == 'n' {
		if required {
			return "", missingf(CodeInvalidParams, "%s is missing", name)
		}
		return "", nil
	}
	if kindOf(v) != '"' {
		return "", Errorf(CodeInvalidParams, "%s must be a string", name)
	}
	s, ok := "", false
	if intern {
		s, ok = internToken(v)
	} else {
		s, ok = unquote(v)
	}
	if !ok {
		return "", Errorf(CodeInvalidParams, "%s is not a valid string", name)
	}
	if len(s) > MulticaMaxID {
		return "", Errorf(CodeInvalidParams, "%s is longer than %d bytes", name, MulticaMaxID)
	}
	if required && s == "" {
		return "", missingf(CodeInvalidParams, "%s is empty", name)
	}
	return s, nil
}

// DecodeCheckedMulticaRequest reads the payload of a Multica "request" to
// the hub, a RequestPayload {requestId, method, params?, meta?}, from a
// message DecodeMulticaMessage accepted (so it is valid JSON within the
// limits; it is walked once more, not scanned): the request it calls,
// with params (an object or an array) as sent and meta read as the
// "meta" of JSON-RPC (the envelope headers, destination, origin, id).
// The method is the name as sent (mapping the seed's names is the
// surface's business). requestID is returned whenever it could be read,
// also with an error, so that the error is answered to it.
//
// Refusals are INVALID_PARAMS (not an object, requestId not a string of
// 1..MulticaMaxID bytes, method not a non-empty string, params neither an
// object nor an array), INVALID_REQUEST (a key given twice, a bad header
// in meta; the requestId is still returned when the payload's head gives
// it once).
func DecodeCheckedMulticaRequest(payload []byte) (requestID string, req Request, err *Error) {
	if kindOf(payload) != '{' {
		return "", req, NewError(CodeInvalidParams, "a request's payload must be an object {requestId, method, params?}")
	}
	var rid, method, params, meta []byte
	err = eachMember(payload, func(key string, v []byte) *Error {
		switch key {
		case "requestId":
			rid = v
		case "method":
			method = v
		case "params":
			params = v
		case "meta":
			meta = v
		}
		return nil
	})
	if err != nil {
		// A key given twice: answered to the requestId when the head
		// shows one, given once.
		v, found := recoverStrings(payload, "requestId")
		if found[0] && v[0] != "" && len(v[0]) <= MulticaMaxID {
			requestID = v[0]
		}
		return requestID, req, err
	}
	requestID, ok := multicaRequestID(rid)
	if !ok {
		return "", req, Errorf(CodeInvalidParams, "requestId must be a string of 1..%d bytes", MulticaMaxID)
	}
	if kindOf(method) == '"' {
		req.Method, _ = internToken(method)
	}
	if req.Method == "" {
		return requestID, req, missingf(CodeInvalidParams, "method must be a non-empty string")
	}
	switch kindOf(params) {
	case 0, 'n':
	case '{', '[':
		req.Params = params
	default:
		return requestID, req, NewError(CodeInvalidParams, "params must be an object or an array")
	}
	if meta != nil && kindOf(meta) != 'n' {
		if err := decodeMeta(meta, &req); err != nil {
			return requestID, req, err
		}
	}
	return requestID, req, nil
}

// MulticaRequestID returns the requestId of a request's payload (from a
// message DecodeMulticaMessage accepted) as DecodeCheckedMulticaRequest
// reads it, or "" when it has none that is valid: a request that cannot
// be delivered is answered to it.
func MulticaRequestID(payload []byte) string {
	if kindOf(payload) != '{' {
		return ""
	}
	var rid []byte
	if eachMember(payload, func(key string, v []byte) *Error {
		if key == "requestId" {
			rid = v
		}
		return nil
	}) != nil {
		// A key given twice: the requestId when the head shows one, given
		// once, as DecodeCheckedMulticaRequest answers to.
		v, found := recoverStrings(payload, "requestId")
		if found[0] && v[0] != "" && len(v[0]) <= MulticaMaxID {
			return v[0]
		}
		return ""
	}
	id, _ := multicaRequestID(rid)
	return id
}

func multicaRequestID(v []byte) (string, bool) {
	if kindOf(v) != '"' {
		return "", false
	}
	s, ok := unquote(v)
	if !ok || s == "" || len(s) > MulticaMaxID {
		return "", false
	}
	return s, true
}

// DecodeCheckedMulticaChat reads the payload of a Multica "message" to
// the hub, {agentId, content} with content a string (from a message
// DecodeMulticaMessage accepted): the agent to send content to. content
// is returned as sent (a JSON string). A payload not of that shape is
// INVALID_PARAMS, a key given twice INVALID_REQUEST.
func DecodeCheckedMulticaChat(payload []byte) (agentID string, content json.RawMessage, err *Error) {
	bad := NewError(CodeInvalidParams, "a message to the hub needs payload {agentId, content}, content a string")
	if kindOf(payload) != '{' {
		return "", nil, bad
	}
	var agent []byte
	err = eachMember(payload, func(key string, v []byte) *Error {
		switch key {
		case "agentId":
			agent = v
		case "content":
			content = v
		}
		return nil
	})
	if err != nil {
		return "", nil, err
	}
	if kindOf(agent) != '"' || kindOf(content) != '"' {
		return "", nil, bad
	}
	if agentID, _ = unquote(agent); agentID == "" {
		return "", nil, bad
	}
	return agentID, content, nil
}
