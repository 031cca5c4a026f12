package dashboard

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed assets/index.html assets/dashboard.js assets/dashboard.css assets/vendor/uplot/uPlot.iife.min.js assets/vendor/uplot/uPlot.min.css assets/vendor/uplot/LICENSE
var assetsFS embed.FS

// assets maps the names under assets/ to embedded files and their content
// types.
var assets = map[string]struct{ file, ctype string }{
	"dashboard.js":      {"assets/dashboard.js", "text/javascript; charset=utf-8"},
	"dashboard.css":     {"assets/dashboard.css", "text/css; charset=utf-8"},
	"uPlot.iife.min.js": {"assets/vendor/uplot/uPlot.iife.min.js", "text/javascript; charset=utf-8"},
	"uPlot.min.css":     {"assets/vendor/uplot/uPlot.min.css", "text/css; charset=utf-8"},
	"uPlot-LICENSE":     {"assets/vendor/uplot/LICENSE", "text/plain; charset=utf-8"},
}

// Handler serves the page for a path ending in "/", data.json, and the
// assets under assets/; anything else is 404, any method but GET and HEAD
// 405. The page uses relative links, so it works under any path prefix.
type Handler struct {
	// Data returns the JSON of data.json at now.
	Data func(now time.Time) Data
}

// ServeHTTP serves the page, its assets and data.json.
func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, fmt.Sprintf("dashboard: method %s not allowed", r.Method), http.StatusMethodNotAllowed)
		return
	}
	p := r.URL.Path
	hdr := w.Header()
	hdr.Set("X-Content-Type-Options", "nosniff")
	switch {
	case p == "" || strings.HasSuffix(p, "/"):
		hdr.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
		serveAsset(w, "assets/index.html", "text/html; charset=utf-8")
		return
	case path.Base(p) == "data.json":
		hdr.Set("Cache-Control", "no-store")
		writeJSON(w, h.Data(time.Now()))
		return
	case path.Base(path.Dir(p)) == "assets":
		if a, ok := assets[path.Base(p)]; ok {
			serveAsset(w, a.file, a.ctype)
			return
		}
	}
	http.Error(w, "dashboard: no such page", http.StatusNotFound)
}

func serveAsset(w http.ResponseWriter, name, ctype string) {
	b, err := fs.ReadFile(assetsFS, name)
	if err != nil {
		http.Error(w, fmt.Sprintf("dashboard asset %s: %v", name, err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(b)
}

// writeJSON writes v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("encoding JSON: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

var _ http.Handler = Handler{}
