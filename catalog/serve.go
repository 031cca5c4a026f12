package catalog

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/edge"
)

// Serve answers GET (or HEAD) /v1/models with the merged list and
// /v1/models/{id} with one model's card, from a list at most cache old
// asked of the healthy engines (nil: all of them). Other methods get 405,
// an unknown id 404 and no engine answering 503, all OpenAI-shaped. The
// error is only for a list that cannot be encoded.
func (c *Catalog) Serve(w http.ResponseWriter, r *http.Request, cache time.Duration, healthy map[string]bool) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		edge.Write(w, edge.NewError(http.StatusMethodNotAllowed, edge.TypeInvalidRequest, "method_not_allowed", "",
			"only GET is allowed on "+r.URL.Path))
		return nil
	}
	list, err := c.Models(r.Context(), cache, healthy)
	if err != nil {
		edge.Write(w, edge.NewError(http.StatusServiceUnavailable, edge.TypeServer, edge.CodeNoReplica, "",
			"no inference engine answered with its model list; retry later"))
		return nil
	}
	var body []byte
	if id, ok := strings.CutPrefix(strings.TrimSuffix(r.URL.Path, "/"), "/v1/models/"); ok && id != "" {
		card, found := list.Find(id)
		if !found {
			edge.Write(w, edge.ModelNotFound(id))
			return nil
		}
		body, err = json.Marshal(card)
	} else {
		body, err = json.Marshal(list)
	}
	if err != nil {
		return fmt.Errorf("encoding model list: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
	return nil
}
