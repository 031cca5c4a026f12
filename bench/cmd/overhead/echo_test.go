package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestEchoEngine checks the echo engine's model list and both shapes of
// its usage object (-echo-usage).
func TestEchoEngine(t *testing.T) {
	for _, details := range []bool{true, false} {
		e, err := startEcho("m1", details)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })

		resp, err := http.Get(e.URL() + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Data []struct{ ID string } `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil || len(list.Data) != 1 || list.Data[0].ID != "m1" {
			t.Fatalf("/v1/models: %+v, %v", list, err)
		}

		resp, err = http.Post(e.URL()+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m1","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var answer struct {
			Usage struct {
				PromptTokens     int             `json:"prompt_tokens"`
				CompletionTokens int             `json:"completion_tokens"`
				Details          json.RawMessage `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &answer); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, %v: %s", resp.StatusCode, err, body)
		}
		u := answer.Usage
		if u.CompletionTokens != 2 || u.PromptTokens <= 0 {
			t.Errorf("details=%v: usage %+v", details, u)
		}
		if got := string(u.Details); details != (got == `{"cached_tokens":0}`) || !details && got != "" {
			t.Errorf("details=%v: prompt_tokens_details %q", details, got)
		}
	}
}
