package main

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/envelope/binframe"
)

// nativeWS is the control for the plain JSON-RPC client (jsonRPCWS): the
// native binary frames (agentmesh.v2) written as that client writes, one
// WebSocket message and one write per call under a mutex, none of
// mesh.Client's coalescing. Beside jsonRPCWS it holds the transport equal
// and changes only the message format; beside the agentmesh row it holds
// the format equal and changes only how the client writes.
type nativeWS struct {
	ws  *websocket.Conn
	wmu sync.Mutex
	answers
}

func dialNativeWS(url string, c int) (*nativeWS, error) {
	d := *websocket.DefaultDialer
	d.Subprotocols = []string{envelope.SubprotocolV2}
	ws, _, err := d.Dial(url, nil)
	if err != nil {
		return nil, err
	}
	if sp := ws.Subprotocol(); sp != envelope.SubprotocolV2 {
		ws.Close()
		return nil, fmt.Errorf("hub chose subprotocol %q", sp)
	}
	cl := &nativeWS{ws: ws, answers: newAnswers(c)}
	go cl.read()
	return cl, nil
}

func (cl *nativeWS) read() {
	defer close(cl.done)
	lim := envelope.DefaultLimits()
	var f envelope.Frame
	for {
		_, msg, err := cl.ws.ReadMessage()
		if err != nil {
			return
		}
		if e := binframe.Precheck(msg, lim); e != nil {
			fmt.Fprintf(os.Stderr, "native: damaged message: %v\n", e)
			return
		}
		binframe.Each(msg, lim, true, &f, func(f *envelope.Frame, e *envelope.Error) {
			if e == nil && f.Type != envelope.FrameResponse {
				return // a ping, a goaway: not an answer
			}
			if f.Seq == 0 || f.Seq > uint64(len(cl.ans)) {
				fmt.Fprintf(os.Stderr, "native: answer to unknown seq %d (%v)\n", f.Seq, e)
				return
			}
			if e == nil {
				e = f.Err
			}
			if e != nil {
				cl.ans[f.Seq-1] <- e
				return
			}
			cl.ans[f.Seq-1] <- nil
		})
	}
}

// call sends worker w's call (seq w+1: one in flight each) and waits.
func (cl *nativeWS) call(w int) error {
	now := time.Now()
	req := envelope.Request{ID: envelope.NewIDAt(now), Timestamp: now.UnixMilli(),
		Method: "echo.echo", Params: payload, Version: envelope.Version}
	b := binframe.AppendRequest(nil, uint64(w)+1, &req)
	cl.wmu.Lock()
	err := cl.ws.WriteMessage(websocket.BinaryMessage, b)
	cl.wmu.Unlock()
	if err != nil {
		return err
	}
	return cl.wait(w)
}

func (cl *nativeWS) close() { cl.ws.Close(); <-cl.done }
