package module

import (
	"os"

	"github.com/caddyserver/caddy/v2"
)

// instanceID is the id this instance's router spills by
// (selection.Router.SetInstance): the instance_id setting with its
// placeholders replaced, else the host name (a Kubernetes pod's name, so
// a StatefulSet's ordinals), else none (the shared spill order).
func instanceID(setting string) string {
	if setting != "" {
		return caddy.NewReplacer().ReplaceAll(setting, "")
	}
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}
