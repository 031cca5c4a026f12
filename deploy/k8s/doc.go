// Package k8s holds ramjet's Kubernetes manifests (kustomize base, overlays
// and monitoring) and their tests. It is its own Go module so that the
// Kubernetes API types stay out of the ramjet module's build:
//
//	cd deploy/k8s && go test ./...
package k8s
