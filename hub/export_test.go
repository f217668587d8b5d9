package hub

// FastTaken is how many calls the forward path (fast.go) took.
func FastTaken(h *Hub) int64 { return h.fastTaken.Load() }
