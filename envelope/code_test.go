package envelope_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
)

// The table of DESIGN.md, row by row.
var designTable = []struct {
	name  string
	rpc   int
	http  int
	retry envelope.RetryClass
}{
	{"PARSE_ERROR", -32700, 400, envelope.RetryNever},
	{"INVALID_REQUEST", -32600, 400, envelope.RetryNever},
	{"METHOD_NOT_FOUND", -32601, 404, envelope.RetryNever},
	{"INVALID_PARAMS", -32602, 400, envelope.RetryNever},
	{"INTERNAL_ERROR", -32603, 500, envelope.RetryNever},
	{"RPC_ERROR", -32000, 500, envelope.RetryNever},
	{"AGENT_NOT_FOUND", -32001, 404, envelope.RetryNever},
	{"UNAVAILABLE", -32002, 503, envelope.RetryAlways},
	{"TIMEOUT", -32003, 504, envelope.RetryIdempotent},
	{"CIRCUIT_OPEN", -32004, 503, envelope.RetryAlways},
	{"OVERLOADED", -32005, 429, envelope.RetryAlways},
	{"CANCELLED", -32006, 499, envelope.RetryNever},
	{"UNAUTHENTICATED", -32007, 401, envelope.RetryNever},
	{"PERMISSION_DENIED", -32008, 403, envelope.RetryNever},
}

func TestCodeTable(t *testing.T) {
	codes := envelope.Codes()
	if len(codes) != len(designTable) {
		t.Fatalf("Codes() has %d codes; the design table has %d", len(codes), len(designTable))
	}
	for i, c := range codes {
		row := designTable[i]
		t.Run(row.name, func(t *testing.T) {
			if c.String() != row.name || c.JSONRPC() != row.rpc || c.HTTPStatus() != row.http || c.Retry() != row.retry {
				t.Errorf("code %d = %s %d %d %v; want %+v", c, c, c.JSONRPC(), c.HTTPStatus(), c.Retry(), row)
			}
			txt, err := c.MarshalText()
			if err != nil || string(txt) != row.name {
				t.Errorf("MarshalText = %q, %v", txt, err)
			}
			var back envelope.Code
			if err := back.UnmarshalText(txt); err != nil || back != c {
				t.Errorf("UnmarshalText(%s) = %v, %v", txt, back, err)
			}
			if got, ok := envelope.CodeFromJSONRPC(row.rpc); !ok || got != c {
				t.Errorf("CodeFromJSONRPC(%d) = %v, %v", row.rpc, got, ok)
			}
		})
	}
	var c envelope.Code
	if err := c.UnmarshalText([]byte("SOMETIMES")); err == nil {
		t.Error("UnmarshalText accepted an unknown code")
	}
	if got, ok := envelope.CodeFromJSONRPC(42); ok || got != envelope.CodeRPCError {
		t.Errorf("CodeFromJSONRPC(42) = %v, %v; want RPC_ERROR, false", got, ok)
	}
	if !envelope.CodeTimeout.Retryable(true) || envelope.CodeTimeout.Retryable(false) {
		t.Error("TIMEOUT must be retryable for idempotent methods only")
	}
}

func TestErrors(t *testing.T) {
	e := envelope.Errorf(envelope.CodeTimeout, "waited %d ms", 5)
	if !errors.Is(e, envelope.ErrTimeout) || errors.Is(e, envelope.ErrUnavailable) {
		t.Error("errors.Is must compare codes")
	}
	if e.Error() != "TIMEOUT: waited 5 ms" {
		t.Errorf("Error() = %q", e.Error())
	}
	wrapped := fmt.Errorf("calling: %w", envelope.NewError(envelope.CodeOverloaded, "full"))
	cases := []struct {
		err  error
		want envelope.Code
	}{
		{nil, envelope.CodeOK},
		{context.DeadlineExceeded, envelope.CodeTimeout},
		{context.Canceled, envelope.CodeCancelled},
		{fmt.Errorf("x: %w", context.Canceled), envelope.CodeCancelled},
		{wrapped, envelope.CodeOverloaded},
		{errors.New("disk on fire"), envelope.CodeInternal},
	}
	for _, tc := range cases {
		if got := envelope.CodeOf(tc.err); got != tc.want {
			t.Errorf("CodeOf(%v) = %s; want %s", tc.err, got, tc.want)
		}
	}
	secret := errors.New("password=hunter2")
	if ae := envelope.AsError(secret); ae.Code != envelope.CodeInternal || ae.Message != "internal error" || !errors.Is(ae, secret) {
		t.Errorf("AsError(plain) = %v; want INTERNAL_ERROR without the cause's text, unwrapping to it", ae)
	}
	if envelope.AsError(nil) != nil {
		t.Error("AsError(nil) != nil")
	}
	ns := envelope.NewError(envelope.CodeUnavailable, "x").MarkNotSent()
	if !ns.NotSent() || ns.WithAttempts(2).Attempts() != 2 || !ns.WithAttempts(2).NotSent() {
		t.Error("MarkNotSent / WithAttempts lost a flag")
	}
}

func ExampleChain() {
	trace := func(name string) envelope.Middleware {
		return func(next envelope.Invoker) envelope.Invoker {
			return func(ctx context.Context, r *envelope.Request) (*envelope.Response, error) {
				fmt.Println("enter", name)
				defer fmt.Println("leave", name)
				return next(ctx, r)
			}
		}
	}
	h := func(ctx context.Context, r *envelope.Request) (*envelope.Response, error) {
		fmt.Println("handler")
		return &envelope.Response{}, nil
	}
	inv := envelope.Chain(trace("telemetry"), trace("retry"))(h)
	_, _ = inv(context.Background(), &envelope.Request{Method: "m"})
	// Output:
	// enter telemetry
	// enter retry
	// handler
	// leave retry
	// leave telemetry
}

func ExampleCodeOf() {
	fmt.Println(envelope.CodeOf(context.DeadlineExceeded), envelope.CodeTimeout.JSONRPC(), envelope.CodeTimeout.HTTPStatus())
	// Output: TIMEOUT -32003 504
}
