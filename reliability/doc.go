// Package reliability owns failure handling: the per-method Policy
// (timeout, retries, backoff, retryable codes, idempotency, hedging), the
// PolicySet matched by method pattern, the retry loop with its budget,
// circuit breakers (sony/gobreaker), bulkheads with priorities, and the
// latency tracker behind deadline-aware retries. Each is an
// envelope.Middleware or is used by one.
//
// It knows nothing of transports: instance choice is delegated to the
// invoker it wraps, through the Tried set carried in the context.
package reliability
