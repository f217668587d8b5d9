package hub

// jsonDepth returns the deepest nesting of arrays and objects in data
// (which must be valid JSON), ignoring brackets inside strings. The edge
// surfaces (agentick, Multica) check it before decoding a frame.
func jsonDepth(data []byte) int {
	depth, deepest, inStr, esc := 0, 0, false, false
	for _, c := range data {
		switch {
		case inStr && esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case inStr && c == '"':
			inStr = false
		case inStr:
		case c == '"':
			inStr = true
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}
