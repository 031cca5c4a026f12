package enginesim

import (
	"encoding/json"
	"fmt"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// PromptTokens returns the prompt tokens the simulator runs for a request
// body: a chat completions body (chat) rendered with its chat template and
// tools as the simulator renders it, or a completions body's prompt. A
// router that must see the engine's own token ids (a benchmark adapter
// running a fleet-simulation policy behind Caddy) computes them with it,
// so that its block hashes match the engine's. The tokens are at the
// default density (Options.Density 0 or 4); PromptTokensAt takes another.
func PromptTokens(body []byte, chat bool) ([]uint32, error) {
	return PromptTokensAt(body, chat, engine.Tokenizer{})
}

// PromptTokensAt is PromptTokens for engines whose tokenizer is tok
// (Options.Density).
func PromptTokensAt(body []byte, chat bool, tok engine.Tokenizer) ([]uint32, error) {
	var r genRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("malformed JSON: %w", err)
	}
	if !chat {
		return promptTokens(r.Prompt, tok)
	}
	tools, err := parseTools(r.Tools)
	if err != nil {
		return nil, err
	}
	return renderChat(&r, tools, true, tok)
}
