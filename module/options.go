package module

import (
	"fmt"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// optSetter reads one line-form option of a Caddyfile block from its
// arguments. Options are one line each so that an environment variable
// can carry one: no arguments (an unset {$RJ_*}) keeps the default.
type optSetter func(d *caddyfile.Dispenser, args []string) error

// options is a table of line-form options by name: the ramjet directive,
// ramjet_guard and ramjet_models read their blocks through it.
type options map[string]optSetter

// parse reads d's block: every option at most once, none unknown (what
// names the block in the error).
func (t options) parse(d *caddyfile.Dispenser, what string) error {
	seen := map[string]bool{}
	for d.NextBlock(0) {
		name := d.Val()
		if seen[name] {
			return d.Errf("duplicate option %q", name)
		}
		seen[name] = true
		set, ok := t[name]
		if !ok {
			return d.Errf("unknown %s option %q", what, name)
		}
		if err := set(d, d.RemainingArgs()); err != nil {
			return err
		}
	}
	return nil
}

// optString reads zero or one value into p.
func optString(p *string) optSetter {
	return func(d *caddyfile.Dispenser, args []string) (err error) {
		*p, err = optionalArg(d, args)
		return err
	}
}

// optJoined reads a list (client keys) into p, comma-joined.
func optJoined(p *string) optSetter {
	return func(_ *caddyfile.Dispenser, args []string) error {
		*p = strings.Join(args, ",")
		return nil
	}
}

// optList reads a space- or comma-separated list into p.
func optList(p *[]string) optSetter {
	return func(_ *caddyfile.Dispenser, args []string) error {
		*p = splitList(args)
		return nil
	}
}

// optFlag sets p; it takes no value.
func optFlag(p *bool) optSetter {
	return func(d *caddyfile.Dispenser, args []string) error {
		if len(args) != 0 {
			return d.ArgErr()
		}
		*p = true
		return nil
	}
}

// optValue reads zero or one value into p with parse (the line-form
// arity of argValue; the same value parsers serve both).
func optValue[T any](p *T, parse func(string) (T, error)) optSetter {
	return func(d *caddyfile.Dispenser, args []string) error {
		s, err := optionalArg(d, args)
		if err != nil || s == "" {
			return err
		}
		v, err := parse(s)
		if err != nil {
			return d.Err(err.Error())
		}
		*p = v
		return nil
	}
}

// optSize reads a size with an optional unit (up to 1 TiB) into p.
func optSize(p *int64) optSetter {
	return optValue(p, func(s string) (int64, error) {
		v, err := parseSize(s)
		if err != nil || v <= 0 || v > 1<<40 {
			return 0, fmt.Errorf("%q is not a size up to 1TiB", s)
		}
		return v, nil
	})
}

// optDuration reads a positive duration into p.
func optDuration(p *caddy.Duration) optSetter { return optValue(p, parsePositiveDuration) }

// parseDuration reads a duration (Caddy's syntax: 500ms, 2h, 1d).
func parseDuration(v string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration", v)
	}
	return caddy.Duration(dur), nil
}

// parsePositiveDuration reads a duration above zero.
func parsePositiveDuration(v string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(v)
	if err != nil || dur <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration", v)
	}
	return caddy.Duration(dur), nil
}

// optAllowPaths reads allow_paths into p.
func optAllowPaths(p *[]string) optSetter {
	return func(d *caddyfile.Dispenser, args []string) (err error) {
		*p, err = parseAllowPaths(d, args)
		return err
	}
}

// splitList splits arguments on commas and white space (one token may hold
// a whole list, as {$RJ_UPSTREAM} does) and drops empty items.
func splitList(args []string) []string {
	var out []string
	for _, a := range args {
		out = append(out, strings.FieldsFunc(a, func(r rune) bool {
			return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r'
		})...)
	}
	return out
}

// optionalArg reads zero or one argument; zero (an unset environment
// variable) means "keep the default".
func optionalArg(d *caddyfile.Dispenser, args []string) (string, error) {
	switch len(args) {
	case 0:
		return "", nil
	case 1:
		return args[0], nil
	default:
		return "", d.ArgErr()
	}
}
