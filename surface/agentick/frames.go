package agentick

import (
	"encoding/json"
	"errors"

	"github.com/agentmesh/agentmesh/envelope"
)

// The agentick surface's frames (see agentick.go for the surface).

// ---- frames ----

// agFrame is a decoded client frame (or /invoke body).
type agFrame = Frame

// decodeAgentickFrame decodes one client frame within lim
// (DecodeFrame), its refusals in the seed's codes: a
// required member missing is VALIDATION_REQUIRED, anything else
// VALIDATION_TYPE. On error the frame returned holds what could be read
// (its id, to answer with).
func decodeAgentickFrame(data []byte, lim envelope.Limits, invoke bool) (*agFrame, *agError) {
	f, err := DecodeFrame(data, lim, invoke)
	if err != nil {
		code := agValidationType
		if errors.Is(err, envelope.ErrMissing) {
			code = agValidationReq
		}
		return &f, &agError{Code: code, Message: err.Message}
	}
	return &f, nil
}

// agRes is a res frame.
type agRes struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	OK      bool            `json:"ok"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *agError        `json:"error,omitempty"`
}

func agentickRes(id string, payload json.RawMessage, e *agError) []byte {
	b, err := json.Marshal(agRes{Type: "res", ID: id, OK: e == nil, Payload: payload, Error: e})
	if err != nil {
		b, _ = json.Marshal(agRes{Type: "res", ID: id, Error: agErr(agInternalError, "cannot encode the answer")})
	}
	return b
}

func agentickErrorFrame(e *agError) []byte {
	b, _ := json.Marshal(struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}{"error", e.Code, e.Message})
	return b
}

func agentickEventFrame(event, session string, data any) []byte {
	b, err := json.Marshal(struct {
		Type      string `json:"type"`
		Event     string `json:"event"`
		Category  string `json:"category"`
		SessionID string `json:"sessionId"`
		Data      any    `json:"data"`
	}{"event", event, agentickCategory(event), session, data})
	if err != nil {
		return nil
	}
	return b
}
