package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ramjet-llm/ramjet/bench/fleetsim"
)

// ramjetBases are the -policy names that run lb_policy ramjet (siteFor).
var ramjetBases = []string{"ramjet", "ramjet-nocap", "ramjet-precise"}

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

// parseTarget splits a -policy target into its base policy and the
// lb_policy ramjet settings it names: "ramjet@ixs=-1+qx=-1" is lb_policy
// ramjet with index_share and queue_extra off. A name without "@" is its
// own base with no settings; only the ramjet bases take options. The
// module validates the values when Caddy loads the config.
func parseTarget(pol string) (base string, settings map[string]any, err error) {
	base, spec, found := strings.Cut(pol, "@")
	if !found {
		return pol, nil, nil
	}
	if !slices.Contains(ramjetBases, base) {
		return "", nil, fmt.Errorf("policy %q: only %s take @options", pol, strings.Join(ramjetBases, ", "))
	}
	settings = map[string]any{}
	for _, kv := range strings.Split(spec, "+") {
		k, v, _ := strings.Cut(kv, "=")
		field, ok := ramjetKeys[k]
		if !ok {
			return "", nil, fmt.Errorf("policy %q: unknown option %q (want ixs or qx, as fleetsim's)", pol, k)
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return "", nil, fmt.Errorf("policy %q: %s: %w", pol, k, err)
		}
		settings[field] = fleetsim.ZeroIsNone(x)
	}
	return base, settings, nil
}

// policyBase is pol's base policy (parseTarget), pol itself when it does
// not parse (run checks every target before the first run).
func policyBase(pol string) string {
	if base, _, err := parseTarget(pol); err == nil {
		return base
	}
	return pol
}
