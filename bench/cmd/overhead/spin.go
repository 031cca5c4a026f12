package main

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() { caddy.RegisterModule(spinHandler{}) }

// spinHandlerName is the handler name of spinHandler in a Caddy config.
const spinHandlerName = "overhead_spin"

// spinHandler busy-waits Duration before calling the next handler: serial
// work of a known size on the request's path, to compare with what ramjet's
// handlers and policy add (-spin).
type spinHandler struct {
	Duration caddy.Duration `json:"duration"`
}

func (spinHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers." + spinHandlerName, New: func() caddy.Module { return new(spinHandler) }}
}

func (s spinHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	spinFor(time.Duration(s.Duration))
	return next.ServeHTTP(w, r)
}

// spinFor busy-waits d of wall time, reading the monotonic clock.
func spinFor(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}
