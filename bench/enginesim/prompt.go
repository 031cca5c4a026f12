package enginesim

import (
	"encoding/json"
	"fmt"
)

// PromptTokens returns the prompt tokens the simulator runs for a request
// body: a chat completions body (chat) rendered with its chat template and
// tools as the simulator renders it, or a completions body's prompt. A
// router that must see the engine's own token ids (a benchmark adapter
// running a fleet-simulation policy behind Caddy) computes them with it,
// so that its block hashes match the engine's.
func PromptTokens(body []byte, chat bool) ([]uint32, error) {
	var r genRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("malformed JSON: %w", err)
	}
	if !chat {
		return promptTokens(r.Prompt)
	}
	tools, err := parseTools(r.Tools)
	if err != nil {
		return nil, err
	}
	return renderChat(&r, tools, true)
}
