package kvindex

import (
	"strings"
	"testing"
)

func TestSettingsValidate(t *testing.T) {
	tests := []struct {
		name    string
		give    Settings
		wantErr string
	}{
		{"ok", Settings{Engines: []FeedSpec{{Upstream: "a:1", Events: "tcp://a:2"}}}, ""},
		{"no engines", Settings{}, "engines must list"},
		{"no events", Settings{Engines: []FeedSpec{{Upstream: "a:1"}}}, "upstream and events are required"},
		{"bad events", Settings{Engines: []FeedSpec{{Upstream: "a:1", Events: "ipc:///x"}}}, "want tcp://host:port"},
		{"twice", Settings{Engines: []FeedSpec{{Upstream: "a:1", Events: "tcp://a:2"}, {Upstream: "a:1", Events: "tcp://a:3"}}}, "listed twice"},
		{"canary model", Settings{Engines: []FeedSpec{{Upstream: "a:1", Events: "tcp://a:2"}}, Canary: &CanarySettings{}}, "canary.model is required"},
		{"negative ttl", Settings{Engines: []FeedSpec{{Upstream: "a:1", Events: "tcp://a:2"}}, PredictTTL: -1}, "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.give
			c.SetDefaults()
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestSettingsTokenizeWait: tokenize_wait is auto (the default: WaitAuto,
// the wait rule), always (the zero PreciseConfig) or warm (WaitAuto and
// WaitWarm); anything else is rejected.
func TestSettingsTokenizeWait(t *testing.T) {
	for _, c := range []struct {
		give string
		auto bool
		bad  bool
	}{{"", true, false}, {"auto", true, false}, {"always", false, false}, {"warm", true, false}, {"never", false, true}} {
		s := Settings{Engines: []FeedSpec{{Upstream: "127.0.0.1:8000", Events: "tcp://127.0.0.1:5557"}}, TokenizeWait: c.give}
		s.SetDefaults()
		if err := s.Validate(); (err != nil) != c.bad {
			t.Errorf("tokenize_wait %q: Validate %v, want an error %v", c.give, err, c.bad)
			continue
		}
		if c.bad {
			continue
		}
		pc, err := s.Precise("", "", nil, nil)
		if err != nil || pc.WaitAuto != c.auto || pc.WaitWarm != (c.give == "warm") {
			t.Errorf("tokenize_wait %q: WaitAuto %v WaitWarm %v (err %v), want %v", c.give, pc.WaitAuto, pc.WaitWarm, err, c.auto)
		}
	}
}

// TestSettingsQueueEstimate: queue_estimate reaches PreciseConfig as given
// (0 the default rule, -1 off, a positive factor), anything else negative
// is rejected naming the field.
func TestSettingsQueueEstimate(t *testing.T) {
	for _, c := range []struct {
		give float64
		bad  bool
	}{{0, false}, {-1, false}, {0.5, false}, {2, false}, {-0.5, true}, {-2, true}} {
		pc, ok := validPrecise(t, Settings{QueueEstimate: c.give}, "queue_estimate", c.give, c.bad)
		if ok && pc.QueueEstimate != c.give {
			t.Errorf("queue_estimate %v: PreciseConfig.QueueEstimate %v", c.give, pc.QueueEstimate)
		}
	}
}

// TestSettingsCapLoad: cap_load reaches PreciseConfig.CapLoad as given (0
// the default and -1 off, a positive factor), anything else negative is
// rejected naming the field.
func TestSettingsCapLoad(t *testing.T) {
	for _, c := range []struct {
		give float64
		bad  bool
	}{{0, false}, {-1, false}, {3, false}, {1.5, false}, {-0.5, true}, {-3, true}} {
		pc, ok := validPrecise(t, Settings{CapLoad: c.give}, "cap_load", c.give, c.bad)
		if ok && pc.CapLoad != c.give {
			t.Errorf("cap_load %v: PreciseConfig.CapLoad %v", c.give, pc.CapLoad)
		}
	}
}

// TestSettingsCapPeer: cap_peer reaches PreciseConfig.CapPeer as given (0
// the default and -1 off, a positive factor); another negative one is rejected naming
// the field.
func TestSettingsCapPeer(t *testing.T) {
	for _, c := range []struct {
		give float64
		bad  bool
	}{{0, false}, {1.1, false}, {2, false}, {-1, false}, {-0.5, true}, {-2, true}} {
		pc, ok := validPrecise(t, Settings{CapLoad: 3, CapPeer: c.give}, "cap_peer", c.give, c.bad)
		if ok && (pc.CapPeer != c.give || pc.CapLoad != 3) {
			t.Errorf("cap_peer %v: PreciseConfig.CapPeer %v, CapLoad %v", c.give, pc.CapPeer, pc.CapLoad)
		}
	}
}

// TestSettingsCapGain: cap_gain reaches PreciseConfig.CapGain as given (0
// the default and -1 off, a positive factor); another negative one is rejected naming
// the field.
func TestSettingsCapGain(t *testing.T) {
	for _, c := range []struct {
		give float64
		bad  bool
	}{{0, false}, {1, false}, {0.5, false}, {-1, false}, {-3, true}} {
		pc, ok := validPrecise(t, Settings{CapLoad: 3, CapPeer: 1.1, CapGain: c.give}, "cap_gain", c.give, c.bad)
		if ok && (pc.CapGain != c.give || pc.CapPeer != 1.1) {
			t.Errorf("cap_gain %v: PreciseConfig.CapGain %v, CapPeer %v", c.give, pc.CapGain, pc.CapPeer)
		}
	}
}

// TestSettingsCapFit: cap_fit reaches PreciseConfig.CapFit as given (0
// the default and -1 off, a positive factor), another negative one is rejected naming
// the field; cap_gain_fleet reaches CapGainFleet.
func TestSettingsCapFit(t *testing.T) {
	for _, c := range []struct {
		give float64
		bad  bool
	}{{0, false}, {2, false}, {1.5, false}, {-1, false}, {-2, true}} {
		pc, ok := validPrecise(t, Settings{CapLoad: 3, CapGain: 0.75, CapGainFleet: true, CapFit: c.give}, "cap_fit", c.give, c.bad)
		if ok && (pc.CapFit != c.give || !pc.CapGainFleet || pc.CapGain != 0.75) {
			t.Errorf("cap_fit %v: PreciseConfig.CapFit %v, CapGainFleet %v, CapGain %v", c.give, pc.CapFit, pc.CapGainFleet, pc.CapGain)
		}
	}
}

// validPrecise gives s one engine and its defaults and validates it: an
// error naming field is wanted exactly when bad (field set to give). A
// valid s's PreciseConfig is returned with ok; ok is false when s is bad
// or a check failed (reported).
func validPrecise(t *testing.T, s Settings, field string, give float64, bad bool) (pc PreciseConfig, ok bool) {
	t.Helper()
	s.Engines = []FeedSpec{{Upstream: "127.0.0.1:8000", Events: "tcp://127.0.0.1:5557"}}
	s.SetDefaults()
	err := s.Validate()
	if (err != nil) != bad || bad && !strings.Contains(err.Error(), field) {
		t.Errorf("%s %v: Validate %v, want an error naming it %v", field, give, err, bad)
		return pc, false
	}
	if bad {
		return pc, false
	}
	if pc, err = s.Precise("", "", nil, nil); err != nil {
		t.Errorf("%s %v: Precise: %v", field, give, err)
		return pc, false
	}
	return pc, true
}

// TestSettingsCapStack: the estimate cap's lift stack is the default. With
// cap_load, cap_peer, cap_gain and cap_fit 0 (unset) the precise service
// runs DefaultCapLoad, DefaultCapPeer, DefaultCapGain scaled by the
// fleet's saturation (CapGainFleet) and DefaultCapFit; -1 turns each off
// (and cap_gain -1 leaves cap_gain_fleet unset); an explicit value is kept,
// and an explicit cap_gain is scaled only with cap_gain_fleet.
func TestSettingsCapStack(t *testing.T) {
	for _, c := range []struct {
		name       string
		give, want Settings
	}{
		{"default", Settings{}, Settings{CapLoad: 3, CapPeer: 1.1, CapGain: 0.75, CapGainFleet: true, CapFit: 2.5}},
		{"off", Settings{CapLoad: -1, CapPeer: -1, CapGain: -1, CapFit: -1}, Settings{CapLoad: -1, CapPeer: -1, CapGain: -1, CapFit: -1}},
		{"load off", Settings{CapLoad: -1}, Settings{CapLoad: -1, CapPeer: 1.1, CapGain: 0.75, CapGainFleet: true, CapFit: 2.5}},
		{"explicit", Settings{CapLoad: 2, CapPeer: 1.5, CapGain: 1, CapFit: 3}, Settings{CapLoad: 2, CapPeer: 1.5, CapGain: 1, CapFit: 3}},
		{"explicit fleet", Settings{CapGain: 0.5, CapGainFleet: true}, Settings{CapLoad: 3, CapPeer: 1.1, CapGain: 0.5, CapGainFleet: true, CapFit: 2.5}},
	} {
		pc, ok := validPrecise(t, c.give, c.name, 0, false)
		if !ok {
			continue
		}
		pc.Engines = []PreciseEngine{{Feed: Endpoint{Replica: "a"}}} // no feed to dial
		p, err := NewPrecise(pc)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		w, g := c.want, p.cfg
		if g.CapLoad != w.CapLoad || g.CapPeer != w.CapPeer || g.CapGain != w.CapGain || g.CapGainFleet != w.CapGainFleet || g.CapFit != w.CapFit {
			t.Errorf("%s: cap_load %v, cap_peer %v, cap_gain %v, cap_gain_fleet %v, cap_fit %v; want %v, %v, %v, %v, %v", c.name,
				g.CapLoad, g.CapPeer, g.CapGain, g.CapGainFleet, g.CapFit, w.CapLoad, w.CapPeer, w.CapGain, w.CapGainFleet, w.CapFit)
		}
		p.Close()
	}
}
