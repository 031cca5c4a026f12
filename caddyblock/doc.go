// Package caddyblock reads a Caddyfile block into a config struct by the
// struct's JSON tags: the option name is the field's JSON name and the
// value is parsed by the field's type (string, integer, size, number,
// duration, flag, list; a nested block for a struct field). It is the one
// Caddyfile option parser of ramjet's modules (lb_policy ramjet and its
// nested blocks, ramjet_guard, ramjet_models, ramjet_health,
// ramjet_observe, ramjet_body, ramjet_metrics, ramjet_dashboard,
// ramjet_handover), so that each option is written once, in its struct,
// and duplicate and unknown options are rejected the same way everywhere.
//
// It runs at config time only. Packages module, directive and handover
// use it; it knows nothing of the modules.
package caddyblock
