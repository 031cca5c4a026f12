package integrity

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Contract is the value of the "contract" field of an identity answer
// (docs/identity.md).
const Contract = "ramjet.identity/v1"

// DefaultIdentityPath is where engines serve the identity contract.
const DefaultIdentityPath = "/ramjet/identity"

// maxIdentityBytes bounds an identity answer.
const maxIdentityBytes = 64 << 10

// maxInstanceID bounds the engine-instance id, in bytes.
const maxInstanceID = 256

// Identity is what an engine says it is, in one answer: the digests of
// what it loaded and the id of the running instance.
type Identity struct {
	Contract string `json:"contract"`
	// Model is the served model name (informational; not pinned).
	Model string `json:"model,omitempty"`
	// ModelSHA256 is the SHA-256 of the weights' manifest
	// (docs/identity.md), 64 lowercase hex digits.
	ModelSHA256 string `json:"model_sha256"`
	// TemplateSHA256 is the SHA-256 of the chat template the engine
	// applies, as UTF-8 bytes.
	TemplateSHA256 string `json:"chat_template_sha256"`
	// TokenizerSHA256 is the SHA-256 of the tokenizer file (optional).
	TokenizerSHA256 string `json:"tokenizer_sha256,omitempty"`
	// InstanceID names the engine instance: stable across restarts of the
	// same instance, different for a replaced one.
	InstanceID string `json:"instance_id"`
}

// Pins are the digests an engine must attest to be admitted; an empty
// pin is not checked. Every pin is 64 lowercase hex digits.
type Pins struct {
	ModelSHA256     string `json:"model_sha256,omitempty"`
	TemplateSHA256  string `json:"chat_template_sha256,omitempty"`
	TokenizerSHA256 string `json:"tokenizer_sha256,omitempty"`
}

// Any reports whether any pin is set.
func (p Pins) Any() bool {
	return p.ModelSHA256 != "" || p.TemplateSHA256 != "" || p.TokenizerSHA256 != ""
}

// Validate names a malformed pin.
func (p Pins) Validate() error {
	for _, f := range []struct{ name, v string }{
		{"model_sha256", p.ModelSHA256}, {"chat_template_sha256", p.TemplateSHA256},
		{"tokenizer_sha256", p.TokenizerSHA256}} {
		if f.v != "" && !isDigest(f.v) {
			return fmt.Errorf("pin %s must be 64 lowercase hex digits, got %q", f.name, f.v)
		}
	}
	return nil
}

// Reason says why a replica is not admitted ("" when it is). The set is
// fixed (metric labels).
type Reason string

// Reasons.
const (
	ReasonNone              Reason = ""
	ReasonPending           Reason = "pending"            // not checked yet
	ReasonUnreachable       Reason = "unreachable"        // no answer (connect, timeout)
	ReasonBadStatus         Reason = "bad_status"         // a non-200 answer
	ReasonMalformed         Reason = "malformed"          // not the contract's JSON
	ReasonPartial           Reason = "partial"            // a required field missing or malformed
	ReasonModelMismatch     Reason = "model_mismatch"     // model_sha256 differs from the pin
	ReasonTemplateMismatch  Reason = "template_mismatch"  // chat_template_sha256 differs
	ReasonTokenizerMismatch Reason = "tokenizer_mismatch" // tokenizer_sha256 differs
	ReasonSpecCollapse      Reason = "spec_collapse"      // quarantined: speculative acceptance collapsed
	ReasonFenced            Reason = "fenced"             // quarantined: a committed instance (state file)
)

// Reasons lists every reason but ReasonNone, in a fixed order.
var Reasons = []Reason{ReasonPending, ReasonUnreachable, ReasonBadStatus, ReasonMalformed,
	ReasonPartial, ReasonModelMismatch, ReasonTemplateMismatch, ReasonTokenizerMismatch,
	ReasonSpecCollapse, ReasonFenced}

// Check returns the first pin id does not satisfy, or the contract field
// it lacks; ReasonNone when every pin matches. A pinned tokenizer requires
// tokenizer_sha256.
func (p Pins) Check(id Identity) Reason {
	if r := id.complete(p.TokenizerSHA256 != ""); r != ReasonNone {
		return r
	}
	switch {
	case p.ModelSHA256 != "" && id.ModelSHA256 != p.ModelSHA256:
		return ReasonModelMismatch
	case p.TemplateSHA256 != "" && id.TemplateSHA256 != p.TemplateSHA256:
		return ReasonTemplateMismatch
	case p.TokenizerSHA256 != "" && id.TokenizerSHA256 != p.TokenizerSHA256:
		return ReasonTokenizerMismatch
	}
	return ReasonNone
}

// complete reports ReasonPartial unless every required field is present
// and well formed.
func (id Identity) complete(needTokenizer bool) Reason {
	switch {
	case id.Contract != Contract:
		return ReasonPartial
	case !isDigest(id.ModelSHA256), !isDigest(id.TemplateSHA256):
		return ReasonPartial
	case id.TokenizerSHA256 != "" && !isDigest(id.TokenizerSHA256):
		return ReasonPartial
	case needTokenizer && id.TokenizerSHA256 == "":
		return ReasonPartial
	case id.InstanceID == "" || len(id.InstanceID) > maxInstanceID:
		return ReasonPartial
	}
	return ReasonNone
}

func isDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Commitment is the opaque, keyed name of an attested engine instance
// (and data-parallel rank, -1 for none): HMAC-SHA256 under key of the
// contract fields, as 64 hex digits. It holds no address and reveals
// nothing about the instance without the key.
func Commitment(key []byte, id Identity, rank int) string {
	m := hmac.New(sha256.New, key)
	for _, f := range []string{Contract, id.ModelSHA256, id.TemplateSHA256, id.TokenizerSHA256,
		id.InstanceID, strconv.Itoa(rank)} {
		m.Write([]byte(f))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

// FetchError is a failed identity fetch, with the reason it maps to.
type FetchError struct {
	Reason Reason
	Err    error
}

func (e *FetchError) Error() string { return fmt.Sprintf("identity %s: %v", e.Reason, e.Err) }
func (e *FetchError) Unwrap() error { return e.Err }

// ReasonOf maps an error of FetchIdentity to its reason
// (ReasonUnreachable for any other error).
func ReasonOf(err error) Reason {
	var fe *FetchError
	if errors.As(err, &fe) {
		return fe.Reason
	}
	return ReasonUnreachable
}

// FetchIdentity asks the engine at baseURL (scheme://host:port) for its
// identity at path, with header (e.g. Authorization) added. The answer is
// bounded; an answer that is not the contract's JSON is ReasonMalformed,
// one without a required field ReasonPartial (see Pins.Check, which the
// caller applies).
func FetchIdentity(ctx context.Context, client *http.Client, baseURL, path string, header http.Header, timeout time.Duration) (Identity, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(baseURL, "/")+path, nil)
	if err != nil {
		return Identity{}, &FetchError{ReasonUnreachable, err}
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return Identity{}, &FetchError{ReasonUnreachable, err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxIdentityBytes))
		return Identity{}, &FetchError{ReasonBadStatus, fmt.Errorf("status %d", resp.StatusCode)}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxIdentityBytes+1))
	if err != nil {
		return Identity{}, &FetchError{ReasonUnreachable, fmt.Errorf("reading answer: %w", err)}
	}
	if len(b) > maxIdentityBytes {
		return Identity{}, &FetchError{ReasonMalformed, fmt.Errorf("answer larger than %d bytes", maxIdentityBytes)}
	}
	var id Identity
	if err := json.Unmarshal(b, &id); err != nil {
		return Identity{}, &FetchError{ReasonMalformed, fmt.Errorf("decoding answer: %w", err)}
	}
	if r := id.complete(false); r != ReasonNone {
		return id, &FetchError{r, errors.New("answer lacks a required field of " + Contract)}
	}
	return id, nil
}
