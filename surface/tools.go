package surface

import "encoding/json"

// ToolName reports whether m has only the characters MCP allows in a
// tool name (and 1 to 128 of them): a method a tool-calling client can
// name.
func ToolName(m string) bool {
	if m == "" || len(m) > 128 {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// ObjectSchema returns s when it is a JSON Schema of type object (what
// MCP requires of a tool's schemas), else nil.
func ObjectSchema(s json.RawMessage) json.RawMessage {
	var v struct {
		Type any `json:"type"`
	}
	if len(s) == 0 || json.Unmarshal(s, &v) != nil || v.Type != "object" {
		return nil
	}
	return s
}
