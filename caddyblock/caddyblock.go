package caddyblock

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/ramjet-llm/ramjet/duration"
)

// Block says how a block is read beyond what the struct's fields say.
// Options are named by their path below the block: "alpha", "outlier
// base_ejection", "integrity spec_decode window".
type Block struct {
	// Name names the block in errors: "ramjet", "ramjet_guard".
	Name string
	// Line makes every option line-form: an option without a value (an
	// unset {$ENV}) keeps its default. Otherwise a value option takes
	// exactly one value.
	Line bool
	// Custom reads the options with their own syntax (d is at the
	// option's name); it also adds options that are no field.
	Custom map[string]func(d *caddyfile.Dispenser) error
	// Repeat are the options that may be given more than once.
	Repeat map[string]bool
	// Zero reports whether 0 is a value of an integer, size or duration
	// option (else they must be positive: their zero is the default).
	Zero func(path string) bool
	// Set is called after a field option was read.
	Set func(path string)
	// Check checks (and may rewrite) a string value, by JSON name
	// ("scheme"), wherever the name occurs.
	Check map[string]func(string) (string, error)
	// Words are the keywords an option takes besides its type's values,
	// by path: "outlier consecutive_failures": {"off": -1}; nil sets the
	// zero value ("position": {"overall": nil}).
	Words map[string]map[string]any
}

// Arg is the struct tag value, `caddyfile:"arg"`, of a nested block's
// fields read from the option's own line, in field order:
// `spec_decode observe { ... }`.
const Arg = "arg"

// Parse reads d's block (d at the token before it) into v, a pointer to a
// struct: each option at most once (unless Repeat), none unknown.
func (b *Block) Parse(d *caddyfile.Dispenser, v any) error {
	return b.block(d, "", reflect.ValueOf(v).Elem(), nil)
}

// Sub reads the nested block at d into v as block path, with only the
// options names (Caddyfile name -> JSON name of v's field); custom
// syntax reads it through Sub when its names differ from the JSON ones.
func (b *Block) Sub(d *caddyfile.Dispenser, path string, v any, names map[string]string) error {
	return b.block(d, path, reflect.ValueOf(v).Elem(), names)
}

// Option reads the option at d (its Caddyfile name d.Val(), path names it)
// into v's field of JSON name name.
func (b *Block) Option(d *caddyfile.Dispenser, path string, v any, name string) error {
	f, ok := fields(reflect.ValueOf(v).Elem())[name]
	if !ok {
		return d.Errf("%s: no such field %s", path, name)
	}
	set, err := b.value(d, path, name, f)
	if set && b.Set != nil {
		b.Set(path)
	}
	return err
}

// Known reports whether name is an option of v's block (Custom's
// included).
func (b *Block) Known(v any, name string) bool {
	_, ok := b.Custom[name]
	_, field := fields(reflect.ValueOf(v).Elem())[name]
	return ok || field
}

// Read reads the one option at d (d at its name) into v, as Parse reads
// each; the caller checks repetitions.
func (b *Block) Read(d *caddyfile.Dispenser, v any) error {
	return b.option(d, "", fields(reflect.ValueOf(v).Elem()), nil)
}

func (b *Block) block(d *caddyfile.Dispenser, path string, v reflect.Value, names map[string]string) error {
	fs := fields(v)
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] && !b.Repeat[join(path, opt)] {
			return d.Errf("%s: %s specified more than once", b.what(path), opt)
		}
		seen[opt] = true
		if err := b.option(d, path, fs, names); err != nil {
			return err
		}
	}
	return nil
}

func (b *Block) what(path string) string {
	if path != "" {
		return path
	}
	return b.Name
}

// option reads the option at d of block path (fields fs, names as in Sub).
func (b *Block) option(d *caddyfile.Dispenser, path string, fs map[string]reflect.Value, names map[string]string) error {
	opt := d.Val()
	p := join(path, opt)
	if set, ok := b.Custom[p]; ok {
		return set(d)
	}
	name := opt
	if names != nil {
		name = names[opt]
	}
	f, ok := fs[name]
	if !ok {
		return d.Errf("%s: unrecognized option '%s'", b.what(path), opt)
	}
	set, err := b.value(d, p, name, f)
	if set && b.Set != nil {
		b.Set(p)
	}
	return err
}

// value reads the option at d into f; set is false when a line-form
// option without a value kept its default.
func (b *Block) value(d *caddyfile.Dispenser, path, name string, f reflect.Value) (set bool, err error) {
	t := f.Type()
	if t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct {
		if f.IsNil() {
			f.Set(reflect.New(t.Elem()))
		}
		return true, b.nested(d, path, f.Elem())
	}
	args := d.RemainingArgs()
	switch {
	case t.Kind() == reflect.Bool && len(args) == 0:
		f.SetBool(true)
		return true, b.noBlock(d, path)
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		if len(args) == 0 && !b.Line {
			return false, d.Errf("%s: missing value", path)
		}
		f.Set(reflect.ValueOf(SplitList(args)))
		return len(args) > 0, b.noBlock(d, path)
	}
	switch {
	case len(args) == 0 && b.Line:
		return false, nil
	case len(args) == 0:
		return false, d.Errf("%s: missing value", path)
	case len(args) > 1:
		return false, d.Errf("%s: too many values", path)
	}
	if err := b.noBlock(d, path); err != nil {
		return false, err
	}
	if err := b.scalar(path, name, args[0], f); err != nil {
		return false, d.Errf("%s: %v", path, err)
	}
	return true, nil
}

func (b *Block) noBlock(d *caddyfile.Dispenser, path string) error {
	if d.NextBlock(d.Nesting()) {
		return d.Errf("%s: takes no block", path)
	}
	return nil
}

// nested reads the option line's Arg fields and the block of struct v.
func (b *Block) nested(d *caddyfile.Dispenser, path string, v reflect.Value) error {
	for i := 0; i < v.NumField(); i++ {
		sf := v.Type().Field(i)
		if sf.Tag.Get("caddyfile") != Arg || !d.NextArg() {
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if err := b.scalar(path, name, d.Val(), v.Field(i)); err != nil {
			return d.Errf("%s: %v", path, err)
		}
	}
	if d.NextArg() {
		return d.Errf("%s: too many values", path)
	}
	return b.block(d, path, v, nil)
}

var durationTypes = map[reflect.Type]bool{reflect.TypeOf(caddy.Duration(0)): true, reflect.TypeOf(duration.Duration(0)): true}

// scalar parses s into f by f's type.
func (b *Block) scalar(path, name, s string, f reflect.Value) error {
	if w, ok := b.Words[path][s]; ok {
		if w == nil {
			f.Set(reflect.Zero(f.Type()))
		} else {
			f.Set(reflect.ValueOf(w).Convert(f.Type()))
		}
		return nil
	}
	if f.Kind() == reflect.Pointer {
		p := reflect.New(f.Type().Elem())
		if err := b.scalar(path, name, s, p.Elem()); err != nil {
			return err
		}
		f.Set(p)
		return nil
	}
	zero := b.Zero != nil && b.Zero(path)
	switch {
	case durationTypes[f.Type()]:
		dur, err := caddy.ParseDuration(s)
		if err != nil || dur < 0 || dur == 0 && !zero {
			return fmt.Errorf("%q is not a positive duration", s)
		}
		f.SetInt(int64(dur))
	case f.Kind() == reflect.String:
		if check, ok := b.Check[name]; ok {
			var err error
			if s, err = check(s); err != nil {
				return err
			}
		}
		f.SetString(s)
	case f.Kind() == reflect.Bool:
		on, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("%q is not a boolean", s)
		}
		f.SetBool(on)
	case f.Kind() == reflect.Int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("%q is not an integer", s)
		}
		if n < 0 || n == 0 && !zero {
			return fmt.Errorf("%q is not a positive integer", s)
		}
		f.SetInt(int64(n))
	case f.Kind() == reflect.Int64:
		n, err := ParseSize(s)
		if err != nil {
			return err
		}
		if n == 0 && !zero {
			return fmt.Errorf("%q is not a positive size", s)
		}
		f.SetInt(n)
	case f.Kind() == reflect.Float64:
		x, err := ParseFloat(s)
		if err != nil {
			return err
		}
		f.SetFloat(x)
	default:
		return fmt.Errorf("option has no Caddyfile syntax (%s)", f.Type())
	}
	return nil
}

// fields maps the JSON names of struct v's exported fields (those of
// embedded structs included) to the fields.
func fields(v reflect.Value) map[string]reflect.Value {
	m := map[string]reflect.Value{}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct {
			for k, f := range fields(v.Field(i)) { // as encoding/json
				m[k] = f
			}
			continue
		}
		if sf.IsExported() && name != "" && name != "-" {
			m[name] = v.Field(i)
		}
	}
	return m
}

func join(path, opt string) string {
	if path == "" {
		return opt
	}
	return path + " " + opt
}

// SplitList splits arguments on commas and white space (one token may
// hold a whole list, as {$RJ_UPSTREAM} does) and drops empty items.
func SplitList(args []string) []string {
	var out []string
	for _, a := range args {
		out = append(out, strings.FieldsFunc(a, func(r rune) bool {
			return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r'
		})...)
	}
	return out
}

// ParseFloat reads a finite number.
func ParseFloat(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a number", v)
	}
	return f, nil
}

// ParseSize reads a size with an optional unit (64MiB, 512KB), up to 1 PiB.
func ParseSize(v string) (int64, error) {
	n, err := humanize.ParseBytes(v)
	if err != nil || n > 1<<50 {
		return 0, fmt.Errorf("%q is not a size", v)
	}
	return int64(n), nil
}
