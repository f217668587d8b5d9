package link

import (
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/envelope/binframe"
)

// A link speaks the native frames of the subprotocol its WebSocket
// negotiated: agentmesh.v2 (binary, envelope/binframe) when both ends
// offer it, else agentmesh.v1 (JSON). These encode one frame each in the
// link's own.

// Binary reports whether the link speaks the binary frames (agentmesh.v2).
func (l *Link) Binary() bool { return l.v2 }

// CheckBody checks a body (params, a result) that came on this link as
// JSON, under the link's limits: on a binary link the reader leaves
// bodies unchecked for a FastHandler and a Go call's Completion, so that
// a hub forwarding between binary links never scans them. nil on a JSON
// link, whose reader checked every message whole.
func (l *Link) CheckBody(name string, v []byte) *envelope.Error {
	if !l.v2 {
		return nil
	}
	return binframe.CheckBody(name, v, l.lim)
}

func (l *Link) appendRequest(b []byte, seq uint64, r *envelope.Request) []byte {
	if l.v2 {
		return binframe.AppendRequest(b, seq, r)
	}
	return envelope.AppendRequestFrame(b, seq, r)
}

func (l *Link) appendStreamRequest(b []byte, seq uint64, r *envelope.Request, chunks, bytes uint64) []byte {
	if l.v2 {
		return binframe.AppendStreamRequest(b, seq, r, chunks, bytes)
	}
	return envelope.AppendStreamRequestFrame(b, seq, r, chunks, bytes)
}

func (l *Link) appendResponse(b []byte, seq uint64, res *envelope.Response, e *envelope.Error) []byte {
	if l.v2 {
		return binframe.AppendResponse(b, seq, res, e)
	}
	return envelope.AppendResponseFrame(b, seq, res, e)
}

func (l *Link) appendEnd(b []byte, seq, n uint64, res *envelope.Response, e *envelope.Error) []byte {
	if l.v2 {
		return binframe.AppendEnd(b, seq, n, res, e)
	}
	return envelope.AppendEndFrame(b, seq, n, res, e)
}

func (l *Link) appendChunk(b []byte, seq, n uint64, data []byte) []byte {
	if l.v2 {
		return binframe.AppendChunk(b, seq, n, data)
	}
	return envelope.AppendChunkFrame(b, seq, n, data)
}

func (l *Link) appendCredit(b []byte, seq, n, bytes uint64) []byte {
	if l.v2 {
		return binframe.AppendCredit(b, seq, n, bytes)
	}
	return envelope.AppendCreditFrame(b, seq, n, bytes)
}

func (l *Link) appendCancel(b []byte, seq uint64) []byte {
	if l.v2 {
		return binframe.AppendCancel(b, seq)
	}
	return envelope.AppendCancelFrame(b, seq)
}

func (l *Link) appendGoAway(b []byte) []byte {
	if l.v2 {
		return binframe.AppendGoAway(b)
	}
	return envelope.AppendGoAwayFrame(b)
}

// recoverFrameSeq is envelope.RecoverFrameSeq in the link's frames.
func (l *Link) recoverFrameSeq(head []byte) (envelope.FrameType, uint64, bool) {
	if l.v2 {
		return binframe.RecoverFrameSeq(head)
	}
	return envelope.RecoverFrameSeq(head)
}

// checkBodies checks, on a binary link, the bodies its reader does not
// leave unchecked: a chunk's data and an error's details. Params and
// results are checked where they are handed on (startServing, onResponse),
// unless a FastHandler or a Completion takes them.
func (l *Link) checkBodies(f *envelope.Frame) *envelope.Error {
	switch f.Type {
	case envelope.FrameChunk:
		return l.CheckBody("data", f.Data)
	case envelope.FrameResponse, envelope.FrameEnd:
		if f.Err != nil {
			return l.CheckBody("error.details", f.Err.Data)
		}
		if f.Type == envelope.FrameEnd {
			return l.CheckBody("result", f.Response.Result)
		}
	}
	return nil
}
