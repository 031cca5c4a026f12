package kvindex

import (
	"errors"

	"github.com/ramjet-llm/ramjet/selection"
)

// RequestFor builds the /tokenize request of a body from its one parse
// (selection.Parse): the decoded model and the raw messages and tools
// (chat) or prompt (completions), sliced out of body by the spans the
// parse recorded. Nothing is parsed again.
func RequestFor(ep selection.Endpoint, body []byte, f *selection.Features) (TokenizeRequest, error) {
	if f == nil {
		return TokenizeRequest{}, errors.New("tokenize request: body not parsed")
	}
	req := TokenizeRequest{Model: string(f.Model)}
	if ep == selection.EndpointChat {
		req.Messages, req.Tools = f.Messages.Bytes(body), f.Tools.Bytes(body)
		if req.Messages == nil {
			return TokenizeRequest{}, errors.New("tokenize request: no messages")
		}
		return req, nil
	}
	req.Prompt = f.Prompt.Bytes(body)
	if req.Prompt == nil {
		return TokenizeRequest{}, errors.New("tokenize request: no prompt")
	}
	return req, nil
}
