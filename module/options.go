package module

import (
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
			return d.Errf("unknown %s optSetter %q", what, name)
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

// optSize reads a size with an optional unit into p.
func optSize(p *int64) optSetter {
	return func(d *caddyfile.Dispenser, args []string) (err error) {
		*p, err = parseSizeArg(d, args)
		return err
	}
}

// optDuration reads a positive duration into p.
func optDuration(p *caddy.Duration) optSetter {
	return func(d *caddyfile.Dispenser, args []string) (err error) {
		*p, err = parseDurationArg(d, args)
		return err
	}
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

func parseSizeArg(d *caddyfile.Dispenser, args []string) (int64, error) {
	s, err := optionalArg(d, args)
	if err != nil || s == "" {
		return 0, err
	}
	v, err := parseSize(s)
	if err != nil || v == 0 || v > 1<<40 {
		return 0, d.Errf("not a size: %q", s)
	}
	return v, nil
}

func parseDurationArg(d *caddyfile.Dispenser, args []string) (caddy.Duration, error) {
	s, err := optionalArg(d, args)
	if err != nil || s == "" {
		return 0, err
	}
	v, err := caddy.ParseDuration(s)
	if err != nil || v <= 0 {
		return 0, d.Errf("not a positive duration: %q", s)
	}
	return caddy.Duration(v), nil
}
