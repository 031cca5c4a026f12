package integrity

import (
	"errors"
	"fmt"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/upstream"
)

// Settings is the integrity configuration of one fleet, the JSON of the
// ramjet policy's "integrity" (module.RamjetSelection.Integrity), off
// unless set: compatibility admission against SHA-256 pins read from each
// engine's identity contract (docs/identity.md), and the
// speculative-decoding acceptance-collapse quarantine. A replica that
// integrity holds out is never offered to selection nor to the fallback
// policy (fail closed, per replica: when every replica is out the request
// gets 503). Checks start when the policy first sees its upstream pool
// (its first request) and when /health names the replica; until a
// replica's first identity answer it is out with reason "pending".
// Defaults fills the zero fields; Validate names the bad setting.
type Settings struct {
	// Pins pin the weights (model_sha256: the SHA-256 of the weights'
	// manifest, docs/identity.md), the chat template
	// (chat_template_sha256: of its UTF-8 text) and the tokenizer
	// (tokenizer_sha256: of tokenizer.json), 64 lowercase hex digits
	// each. Default: not pinned.
	Pins
	// IdentityPath is the contract's path on every engine. Default
	// "/ramjet/identity".
	IdentityPath string `json:"identity_path,omitempty"`
	// Interval is the time between two identity checks of a replica.
	// Default 10s.
	Interval duration.Duration `json:"interval,omitempty"`
	// Timeout bounds one identity fetch or metrics scrape. Default 2s.
	Timeout duration.Duration `json:"timeout,omitempty"`
	// Access is how the engines are reached for the checks: scheme
	// ("http" or "https", default "http") and upstream_token (sent with
	// every check as "Authorization: Bearer <token>", placeholders
	// resolved; default none).
	upstream.Access
	// Spec turns on the acceptance-collapse quarantine; nil: off.
	Spec *SpecSettings `json:"spec_decode,omitempty"`
	// Token is the upstream token with its placeholders resolved, set
	// by the module before NewService ("" none).
	Token string `json:"-"`
}

// SpecSettings configures the speculative-decoding acceptance-collapse
// quarantine: each engine's vllm:spec_decode_* counters are scraped once
// per window; N consecutive complete windows with draft tokens but no
// accepted token (overall, or at Position) make a collapse.
type SpecSettings struct {
	// Mode is "observe" (report the collapse: metrics, /health,
	// /ramjet/fleet, a log line; keep routing) or "enforce" (commit the
	// engine instance to StateFile, then hold the replica out until a
	// different attested instance answers at that address). Default
	// "observe". In the Caddyfile: spec_decode observe|enforce { ... }.
	Mode string `json:"mode,omitempty" caddyfile:"arg"`
	// Window is the length of one window (one scrape per window).
	// Default 10s.
	Window duration.Duration `json:"window,omitempty"`
	// Windows is N. Default 3.
	Windows int `json:"windows,omitempty"`
	// Position watches the acceptance at this draft position (0-based,
	// vllm:spec_decode_num_accepted_tokens_per_pos_total) instead of the
	// overall acceptance. Default: overall.
	Position *int `json:"position,omitempty"`
	// MetricsPath is the engines' metrics path. Default "/metrics".
	MetricsPath string `json:"metrics_path,omitempty"`
	// StateFile is where enforce mode keeps its commitments (keyed hashes
	// of engine identities: no address, no prompt). Required for
	// enforce.
	StateFile string `json:"state_file,omitempty"`
	// CommitmentKey keys the commitments and seals the state file, at
	// least 16 bytes; use a placeholder such as {env.RJ_INTEGRITY_KEY}.
	// Required for enforce; it must stay the same across restarts.
	CommitmentKey string `json:"commitment_key,omitempty"`
	// Key is CommitmentKey with its placeholders resolved, set by the
	// module.
	Key []byte `json:"-"`
}

// Defaults fills the zero fields with the defaults.
func (s *Settings) Defaults() {
	if s.IdentityPath == "" {
		s.IdentityPath = DefaultIdentityPath
	}
	if s.Interval == 0 {
		s.Interval = duration.Duration(10 * time.Second)
	}
	if s.Timeout == 0 {
		s.Timeout = duration.Duration(2 * time.Second)
	}
	if s.Scheme == "" {
		s.Scheme = "http"
	}
	if sd := s.Spec; sd != nil {
		if sd.Mode == "" {
			sd.Mode = "observe"
		}
		if sd.Window == 0 {
			sd.Window = duration.Duration(10 * time.Second)
		}
		if sd.Windows == 0 {
			sd.Windows = 3
		}
		if sd.MetricsPath == "" {
			sd.MetricsPath = "/metrics"
		}
	}
}

// Validate names the bad setting (the module's option names). It expects
// Defaults to have run.
func (s *Settings) Validate() error {
	if err := s.Pins.Validate(); err != nil {
		return fmt.Errorf("integrity: %w", err)
	}
	switch {
	case s.Interval < 0:
		return errors.New("integrity interval must be positive")
	case s.Timeout < 0:
		return errors.New("integrity timeout must be positive")
	case s.Scheme != "http" && s.Scheme != "https":
		return fmt.Errorf("integrity scheme must be http or https, got %q", s.Scheme)
	case s.IdentityPath[0] != '/':
		return fmt.Errorf("integrity identity_path must start with '/', got %q", s.IdentityPath)
	}
	sd := s.Spec
	if sd == nil {
		if !s.Pins.Any() {
			return errors.New("integrity: set at least one pin or spec_decode")
		}
		return nil
	}
	switch {
	case sd.Mode != "observe" && sd.Mode != "enforce":
		return fmt.Errorf("integrity spec_decode mode must be observe or enforce, got %q", sd.Mode)
	case sd.Window < 0:
		return errors.New("integrity spec_decode window must be positive")
	case sd.Windows < 0:
		return errors.New("integrity spec_decode windows must be positive")
	case sd.Position != nil && (*sd.Position < 0 || *sd.Position >= MaxPositions):
		return fmt.Errorf("integrity spec_decode position must be in [0,%d), got %d", MaxPositions, *sd.Position)
	case sd.MetricsPath[0] != '/':
		return fmt.Errorf("integrity spec_decode metrics_path must start with '/', got %q", sd.MetricsPath)
	}
	if sd.Mode == "enforce" {
		if sd.StateFile == "" {
			return errors.New("integrity spec_decode enforce needs state_file")
		}
		if len(sd.Key) < MinKeyBytes {
			return fmt.Errorf("integrity spec_decode enforce needs a commitment_key of at least %d bytes", MinKeyBytes)
		}
	}
	return nil
}

// Enforce reports whether the settings commit collapses to a state file.
func (s *Settings) Enforce() bool { return s.Spec != nil && s.Spec.Mode == "enforce" }

// ParseSpecMode reads a spec_decode mode: observe or enforce.
func ParseSpecMode(v string) (string, error) {
	if v != "observe" && v != "enforce" {
		return "", fmt.Errorf("want observe or enforce, got %q", v)
	}
	return v, nil
}
