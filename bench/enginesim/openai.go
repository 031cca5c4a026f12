package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// apiError is an error answered as OpenAI-shaped JSON.
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string
}

func (e *apiError) Error() string { return e.Message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "BadRequestError", Param: param, Message: fmt.Sprintf(format, args...)}
}

func errorType(status int) string {
	switch status {
	case 400:
		return "BadRequestError"
	case 404:
		return "NotFoundError"
	case 413:
		return "RequestEntityTooLarge"
	case 429:
		return "RateLimitError"
	case 503:
		return "ServiceUnavailableError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.Type == "" {
		e.Type = errorType(e.Status)
	}
	var param any
	if e.Param != "" {
		param = e.Param
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": e.Message, "type": e.Type, "param": param, "code": e.Status,
	}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeError(w, &apiError{Status: 500, Message: "encode response: " + err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func itoa(n int) string { return strconv.Itoa(n) }

// chatMessage is one message of a chat request.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []wireToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type wireToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// genRequest is the union of the chat and completions request fields the
// simulator reads.
type genRequest struct {
	Model         string            `json:"model"`
	Messages      []chatMessage     `json:"messages"`
	Prompt        json.RawMessage   `json:"prompt"`
	Tools         []json.RawMessage `json:"tools"`
	ToolChoice    json.RawMessage   `json:"tool_choice"`
	Stream        bool              `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	N                   *int           `json:"n"`
	ReasoningEffort     string         `json:"reasoning_effort"`
	ChatTemplateKwargs  map[string]any `json:"chat_template_kwargs"`
	AddGenerationPrompt *bool          `json:"add_generation_prompt"`
	AddSpecialTokens    *bool          `json:"add_special_tokens"`
}

// contentText flattens a message content (string, parts array or null).
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", err
	}
	var b bytes.Buffer
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		} else {
			b.WriteString("<|vision_start|><|image_pad|><|vision_end|>")
		}
	}
	return b.String(), nil
}

// tool is one parsed tool definition.
type tool struct {
	name   string
	argKey string
	raw    string // compact JSON, as rendered into the system prompt
}

func parseTools(raws []json.RawMessage) ([]tool, error) {
	out := make([]tool, 0, len(raws))
	for i, raw := range raws {
		var t struct {
			Function struct {
				Name       string `json:"name"`
				Parameters struct {
					Properties map[string]json.RawMessage `json:"properties"`
					Required   []string                   `json:"required"`
				} `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(raw, &t); err != nil || t.Function.Name == "" {
			return nil, badRequest(fmt.Sprintf("tools[%d]", i), "tools[%d] must be a function with a name", i)
		}
		key := "input"
		if len(t.Function.Parameters.Required) > 0 {
			key = t.Function.Parameters.Required[0]
		}
		var c bytes.Buffer
		if err := json.Compact(&c, raw); err != nil {
			return nil, badRequest("tools", "tools[%d]: %v", i, err)
		}
		out = append(out, tool{name: t.Function.Name, argKey: key, raw: c.String()})
	}
	return out, nil
}

// pickToolCall decides whether the reply is a tool call: "required" or a
// named function always; "auto" (the default with tools) when the last
// message is the user's (so an agent loop alternates call and answer);
// "none" never.
func pickToolCall(tools []tool, choice json.RawMessage, msgs []chatMessage, seed uint64) (*engine.ToolCall, string, error) {
	if len(tools) == 0 {
		return nil, "", nil
	}
	mode := "auto"
	var named string
	choice = bytes.TrimSpace(choice)
	if len(choice) > 0 && string(choice) != "null" {
		if choice[0] == '"' {
			_ = json.Unmarshal(choice, &mode)
		} else {
			var c struct {
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			if err := json.Unmarshal(choice, &c); err != nil || c.Function.Name == "" {
				return nil, "", badRequest("tool_choice", "tool_choice must be none, auto, required or a named function")
			}
			mode, named = "named", c.Function.Name
		}
	}
	var t *tool
	switch mode {
	case "none":
		return nil, "", nil
	case "auto":
		if len(msgs) == 0 || msgs[len(msgs)-1].Role != "user" {
			return nil, "", nil
		}
		t = &tools[seed%uint64(len(tools))]
	case "required":
		t = &tools[seed%uint64(len(tools))]
	case "named":
		for i := range tools {
			if tools[i].name == named {
				t = &tools[i]
			}
		}
		if t == nil {
			return nil, "", badRequest("tool_choice", "tool_choice names unknown function %q", named)
		}
	default:
		return nil, "", badRequest("tool_choice", "tool_choice %q is not supported", mode)
	}
	return &engine.ToolCall{ID: fmt.Sprintf("chatcmpl-tool-%016x", seed), Name: t.name}, t.argKey, nil
}

// wantsReasoning reports whether the request asks for reasoning content.
func wantsReasoning(r *genRequest) bool {
	if r.ReasoningEffort != "" && r.ReasoningEffort != "none" {
		return true
	}
	v, ok := r.ChatTemplateKwargs["enable_thinking"].(bool)
	return ok && v
}

// renderChat turns messages and tools into prompt tokens at tok's density.
func renderChat(r *genRequest, tools []tool, addGen bool, tok engine.Tokenizer) ([]uint32, error) {
	msgs := make([]engine.Message, 0, len(r.Messages))
	for i, m := range r.Messages {
		text, err := contentText(m.Content)
		if err != nil {
			return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content must be a string or an array of parts", i)
		}
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role %q is not supported", i, m.Role)
		}
		em := engine.Message{Role: m.Role, Content: text, ToolCallID: m.ToolCallID}
		if m.Role == "developer" {
			em.Role = "system"
		}
		for _, tc := range m.ToolCalls {
			em.ToolCalls = append(em.ToolCalls, engine.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		msgs = append(msgs, em)
	}
	raws := make([]string, len(tools))
	for i, t := range tools {
		raws[i] = t.raw
	}
	return tok.RenderChat(nil, raws, msgs, addGen), nil
}

// promptTokens reads a completions prompt: a string or an array of token
// ids (a single prompt only), text cut at tok's density.
func promptTokens(raw json.RawMessage, tok engine.Tokenizer) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("prompt", "prompt: %v", err)
		}
		return tok.Text(nil, s), nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		return ids, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil && len(strs) == 1 {
		return tok.Text(nil, strs[0]), nil
	}
	return nil, badRequest("prompt", "prompt must be a string, one-element string array or token id array")
}
