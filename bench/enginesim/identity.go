package enginesim

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// IdentityContract is the contract the simulator's GET /ramjet/identity
// implements (docs/identity.md).
const IdentityContract = "ramjet.identity/v1"

// Identity is the simulator's answer to GET /ramjet/identity: the digests
// of what it claims to have loaded and its engine-instance id. Change it
// at run time with SetIdentity or PUT /sim/identity.
type Identity struct {
	ModelSHA256     string `json:"model_sha256"`
	TemplateSHA256  string `json:"chat_template_sha256"`
	TokenizerSHA256 string `json:"tokenizer_sha256,omitempty"`
	InstanceID      string `json:"instance_id"`
	// Serve is how the endpoint answers: "" (the whole identity),
	// "partial" (without instance_id), "malformed" (not JSON),
	// "unavailable" (503) or "off" (404, as an engine without the
	// middleware).
	Serve string `json:"serve,omitempty"`
}

// IdentityOptions sets the initial identity. Zero fields take the
// defaults: digests of fixed strings derived from the model name
// (DefaultIdentity) and a random instance id per Start. Restart keeps the
// instance id: it is the same instance restarted.
type IdentityOptions struct {
	Identity
}

// Digest is the hex SHA-256 of s (for tests that pin the simulator's
// defaults).
func Digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// DefaultIdentity is the identity a simulator serving model starts with,
// less the instance id.
func DefaultIdentity(model string) Identity {
	return Identity{
		ModelSHA256:     Digest("enginesim weights " + model),
		TemplateSHA256:  Digest("enginesim chat template"),
		TokenizerSHA256: Digest("enginesim tokenizer"),
	}
}

type identityState struct {
	mu sync.Mutex
	id Identity
}

func (s *Server) initIdentity() {
	id := s.opts.Identity.Identity
	def := DefaultIdentity(s.opts.Model)
	if id.ModelSHA256 == "" {
		id.ModelSHA256 = def.ModelSHA256
	}
	if id.TemplateSHA256 == "" {
		id.TemplateSHA256 = def.TemplateSHA256
	}
	if id.TokenizerSHA256 == "" {
		id.TokenizerSHA256 = def.TokenizerSHA256
	}
	if id.InstanceID == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		id.InstanceID = "enginesim-" + hex.EncodeToString(b)
	}
	s.ident.id = id
}

// Identity returns the current identity.
func (s *Server) Identity() Identity {
	s.ident.mu.Lock()
	defer s.ident.mu.Unlock()
	return s.ident.id
}

// SetIdentity replaces the identity (empty fields stay as they are, but
// Serve is always replaced).
func (s *Server) SetIdentity(id Identity) error {
	switch id.Serve {
	case "", "partial", "malformed", "unavailable", "off":
	default:
		return fmt.Errorf("serve must be partial, malformed, unavailable or off, got %q", id.Serve)
	}
	s.ident.mu.Lock()
	defer s.ident.mu.Unlock()
	cur := &s.ident.id
	for _, f := range []struct {
		dst *string
		v   string
	}{
		{&cur.ModelSHA256, id.ModelSHA256}, {&cur.TemplateSHA256, id.TemplateSHA256},
		{&cur.TokenizerSHA256, id.TokenizerSHA256}, {&cur.InstanceID, id.InstanceID}} {
		if f.v != "" {
			*f.dst = f.v
		}
	}
	cur.Serve = id.Serve
	return nil
}

func (s *Server) handleIdentity(w http.ResponseWriter, _ *http.Request) {
	id := s.Identity()
	switch id.Serve {
	case "off":
		writeError(w, &apiError{Status: http.StatusNotFound, Message: "GET /ramjet/identity not found"})
		return
	case "unavailable":
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: "identity not available"})
		return
	case "malformed":
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "<html>not an identity</html>")
		return
	}
	out := map[string]string{
		"contract": IdentityContract, "model": s.opts.Model,
		"model_sha256": id.ModelSHA256, "chat_template_sha256": id.TemplateSHA256,
		"instance_id": id.InstanceID,
	}
	if id.TokenizerSHA256 != "" {
		out["tokenizer_sha256"] = id.TokenizerSHA256
	}
	if id.Serve == "partial" {
		delete(out, "instance_id")
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) identityAdminRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /sim/identity", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, s.Identity()) })
	mux.HandleFunc("PUT /sim/identity", func(w http.ResponseWriter, r *http.Request) {
		var id Identity
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&id); err != nil {
			writeError(w, badRequest("", "identity: %v", err))
			return
		}
		if err := s.SetIdentity(id); err != nil {
			writeError(w, badRequest("", "identity: %v", err))
			return
		}
		writeJSON(w, 200, s.Identity())
	})
}
