package main

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/ramjet-llm/ramjet/bench/fleetsim"
)

// ramjetBases are the -policy names that run lb_policy ramjet (siteFor).
var ramjetBases = []string{"ramjet", "ramjet-nocap", "ramjet-precise"}

// routerBases are the -routers-policy names (multiSitesFor): ramjetBases
// and ramjet-precise-nocap.
var routerBases = []string{"ramjet", "ramjet-nocap", "ramjet-precise", "ramjet-precise-nocap"}

// ramjetKeys map the option keys a ramjet target may carry after "@" to the
// lb_policy ramjet JSON fields they set (fleetstate.PolicySettings). The
// keys are the fleet simulation's (fleetsim -policy 'ramjet@ixs=-1+qx=-1'),
// with its values: a number sets the field, 0 or -1 turns it off (-1 in the
// JSON, the module's "off"), so that one target name means the same rule in
// both tools.
var ramjetKeys = map[string]string{
	"ixs": "index_share", // selection.Options.IndexShare
	"qx":  "queue_extra", // selection.Options.QueueExtra
}

// preciseFlags map the flags (no value) a precise target (a base with kv)
// may carry to the kv block's tokenize_wait, as fleetsim's ramjet-precise
// flags of those names: always waits for every preflight
// (ramjet-precise@always), wait is the wait rule (the default), warm
// the rule waiting only where the estimate credits some replica.
var preciseFlags = map[string]string{"always": "always", "wait": "auto", "warm": "warm"}

// preciseKeys map the option keys only a precise target may carry to the
// kv block's fields they set, with ramjetKeys' values: qe is fleetsim's
// ramjet-precise@qe (kvindex's QueueEstimate; qe=0 the rule before it),
// capl its @capl (kvindex's CapLoad; capl=0 the estimate cap everywhere,
// the rule before the lift stack became the default on 2026-12-07),
// capm its @capm (CapPeer), capg its @capg (CapGain, unscaled), capgf its
// @capgf (CapGain with cap_gain_fleet), capfit its @capfit (CapFit) and
// capfq its @capfq (CapForeignQueue; capfq=0 the rule before 2026-12-07).
// As in fleetsim, a key left out keeps the module's default (the lift
// stack: capl=3+capm=1.1+capgf=0.75+capfit=2.5) and 0 turns it off.
var preciseKeys = map[string]string{"qe": "queue_estimate", "capl": "cap_load", "capm": "cap_peer", "capg": "cap_gain", "capgf": "cap_gain", "capfq": "cap_foreign_queue", "capfit": "cap_fit"}

// kvSetting sets the kv block's field k to v in a target's settings.
func kvSetting(settings map[string]any, k string, v any) {
	kv, _ := settings["kv"].(map[string]any)
	if kv == nil {
		kv = map[string]any{}
		settings["kv"] = kv
	}
	kv[k] = v
}

// parseTarget splits a -policy target into its base policy and the
// lb_policy ramjet settings it names: "ramjet@ixs=-1+qx=-1" is lb_policy
// ramjet with index_share and queue_extra off, "ramjet-precise@always" is
// the precise path with tokenize_wait always (settings["kv"], merged into
// the kv block by applySettings). A name without "@" is its own base with
// no settings; only the ramjet bases take options. The module validates
// the values when Caddy loads the config.
func parseTarget(pol string) (base string, settings map[string]any, err error) {
	return parseOptions(pol, ramjetBases, "policy")
}

// parseRoutersTarget is parseTarget for a -routers-policy target: its base
// must be one of routerBases, and takes the same options.
func parseRoutersTarget(pol string) (base string, settings map[string]any, err error) {
	base, settings, err = parseOptions(pol, routerBases, "-routers-policy")
	if err == nil && !slices.Contains(routerBases, base) {
		err = fmt.Errorf("-routers-policy %q: want %s, with @options or not", pol, strings.Join(routerBases, ", "))
	}
	return base, settings, err
}

// parseOptions parses pol's options after "@" for a base among bases.
func parseOptions(pol string, bases []string, what string) (base string, settings map[string]any, err error) {
	base, spec, found := strings.Cut(pol, "@")
	if !found {
		return pol, nil, nil
	}
	if !slices.Contains(bases, base) {
		return "", nil, fmt.Errorf("%s %q: only %s take @options", what, pol, strings.Join(bases, ", "))
	}
	settings = map[string]any{}
	for _, kv := range strings.Split(spec, "+") {
		k, v, hasValue := strings.Cut(kv, "=")
		if wait, ok := preciseFlags[k]; ok && !hasValue {
			if !strings.HasPrefix(base, "ramjet-precise") {
				return "", nil, fmt.Errorf("%s %q: %s needs a ramjet-precise base (the kv block's tokenize_wait)", what, pol, k)
			}
			kvSetting(settings, "tokenize_wait", wait)
			continue
		}
		if k == "noqx" && !hasValue {
			// fleetsim's ramjet-precise@noqx: the precise path's rule
			// before 2026-12-07, QueueExtra off (queue_extra -1).
			if !strings.HasPrefix(base, "ramjet-precise") {
				return "", nil, fmt.Errorf("%s %q: noqx needs a ramjet-precise base (ramjet@qx=-1 elsewhere)", what, pol)
			}
			settings["queue_extra"] = -1.0
			continue
		}
		if k == "dl" && v == "0" {
			// fleetsim's dl=0: the density fixed at chars_per_token.
			settings["fixed_density"] = true
			continue
		}
		field, ok := ramjetKeys[k]
		kvField, precise := preciseKeys[k]
		if !ok && !precise {
			return "", nil, fmt.Errorf("%s %q: unknown option %q (want ixs, qx or dl=0, as fleetsim's, or always, wait, noqx, qe, capl, capm, capg, capgf, capfit or capfq on ramjet-precise)", what, pol, k)
		}
		if precise && !strings.HasPrefix(base, "ramjet-precise") {
			return "", nil, fmt.Errorf("%s %q: %s needs a ramjet-precise base (the kv block's %s)", what, pol, k, kvField)
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return "", nil, fmt.Errorf("%s %q: %s: %w", what, pol, k, err)
		}
		if precise {
			kvSetting(settings, kvField, fleetsim.ZeroIsNone(x))
			if k == "capgf" {
				kvSetting(settings, "cap_gain_fleet", true)
			}
			continue
		}
		settings[field] = fleetsim.ZeroIsNone(x)
	}
	return base, settings, nil
}

// applySettings sets a target's settings (parseTarget) in an lb_policy
// ramjet config: each field, and the kv block's fields merged into a copy
// of cfg's kv block (sites may share one).
func applySettings(cfg, settings map[string]any) {
	for k, v := range settings {
		sub, ok := v.(map[string]any)
		if k != "kv" || !ok {
			cfg[k] = v
			continue
		}
		kv := map[string]any{}
		if old, ok := cfg["kv"].(map[string]any); ok {
			maps.Copy(kv, old)
		}
		maps.Copy(kv, sub)
		cfg["kv"] = kv
	}
}

// policyBase is pol's base policy (parseTarget), pol itself when it does
// not parse (run checks every target before the first run).
func policyBase(pol string) string {
	if base, _, err := parseTarget(pol); err == nil {
		return base
	}
	return pol
}
