package hub

// FastTaken is how many calls the forward path (fast.go) took.
func FastTaken(h *Hub) int64 { return h.fastTaken.Load() }

// BulkheadActive is what method's bulkhead runs and queues now.
func BulkheadActive(h *Hub, method string) (running, queued int) {
	return h.bulkheads.Pool(method).Active()
}
