// Package envcheck checks ramjet's environment settings before a
// configuration is used, without Caddy: a setting with the retired MD_
// prefix (Retired), an RJ_* setting the Caddyfile does not read (Check,
// with the nearest known name as a suggestion, Closest), and an empty value
// where Caddy would not read empty as unset. The known names come from the
// Caddyfiles themselves (Names, Known), so the list cannot drift from them.
//
// Package module runs it when the ramjet directive is adapted and when its
// modules are provisioned.
package envcheck
