package k8s

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// decodeStrict decodes one YAML document into the API type of its kind,
// rejecting unknown and duplicate fields.
func decodeStrict(t *testing.T, where string, doc []byte) any {
	t.Helper()
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	var obj any
	switch tm.APIVersion + "/" + tm.Kind {
	case "apps/v1/Deployment":
		obj = &appsv1.Deployment{}
	case "apps/v1/StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "v1/Service":
		obj = &corev1.Service{}
	case "v1/ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1/Secret":
		obj = &corev1.Secret{}
	case "policy/v1/PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		obj = &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		obj = &monitoringv1.PrometheusRule{}
	case "kustomize.config.k8s.io/v1beta1/Kustomization":
		obj = &kusttypes.Kustomization{}
	default:
		t.Fatalf("%s: no API type for %s %s", where, tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatalf("%s: strict decoding %s: %v", where, tm.Kind, err)
	}
	return obj
}

func splitDocs(b []byte) [][]byte {
	var out [][]byte
	for _, d := range bytes.Split(b, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			out = append(out, d)
		}
	}
	return out
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(append(out, l...), '\n')
		}
	}
	return out
}

// TestFilesDecodeStrictly decodes every YAML file as written.
func TestFilesDecodeStrictly(t *testing.T) {
	files, err := filepath.Glob("*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("*/*/*.yaml")
	files = append(files, more...)
	if len(files) < 12 {
		t.Fatalf("only %d manifest files: %v", len(files), files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs := splitDocs(b)
		if len(docs) == 0 {
			t.Errorf("%s: no document", f)
		}
		for _, d := range docs {
			decodeStrict(t, f, d)
		}
	}
}

// TestStrictDecodingRejectsUnknownFields checks the check itself.
func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	doc := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n")
	if err := yaml.UnmarshalStrict(doc, &appsv1.Deployment{}); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Fatalf("unknown field accepted: %v", err)
	}
}

// built is what one kustomization renders, by kind and name.
type built struct {
	deployments  map[string]*appsv1.Deployment
	statefulSets map[string]*appsv1.StatefulSet
	services     map[string]*corev1.Service
	configMaps   map[string]*corev1.ConfigMap
	pdbs         map[string]*policyv1.PodDisruptionBudget
	monitors     map[string]*monitoringv1.ServiceMonitor
	rules        map[string]*monitoringv1.PrometheusRule
	namespace    string
}

func build(t *testing.T, dir string) built {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	b := built{deployments: map[string]*appsv1.Deployment{}, statefulSets: map[string]*appsv1.StatefulSet{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		monitors: map[string]*monitoringv1.ServiceMonitor{}, rules: map[string]*monitoringv1.PrometheusRule{}}
	for _, d := range splitDocs(out) {
		switch o := decodeStrict(t, dir+" (built)", d).(type) {
		case *appsv1.Deployment:
			b.deployments[o.Name] = o
		case *appsv1.StatefulSet:
			b.statefulSets[o.Name] = o
			b.namespace = o.Namespace
		case *corev1.Service:
			b.services[o.Name] = o
		case *corev1.ConfigMap:
			b.configMaps[o.Name] = o
		case *policyv1.PodDisruptionBudget:
			b.pdbs[o.Name] = o
		case *monitoringv1.ServiceMonitor:
			b.monitors[o.Name] = o
		case *monitoringv1.PrometheusRule:
			b.rules[o.Name] = o
		}
	}
	return b
}

func selects(t *testing.T, sel *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(labels.Set(podLabels))
}

func TestOverlays(t *testing.T) {
	caddyfile, err := os.ReadFile("base/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir, engine, namespace string
		replicas               int32
		gpu                    bool
	}{
		{"overlays/simulated", "engine", "ramjet-sim", 2, false},
		{"overlays/vllm", "vllm", "ramjet", 3, true},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			b := build(t, tc.dir)
			if b.namespace != tc.namespace {
				t.Errorf("namespace %q, want %q", b.namespace, tc.namespace)
			}
			// A StatefulSet: its pods' host names (ramjet's default
			// instance_id) end in ordinals, the spill positions that
			// spread several instances best (selection.InstancePosition).
			rj := b.statefulSets["ramjet"]
			if rj == nil {
				t.Fatal("no ramjet StatefulSet")
			}
			if rj.Spec.Replicas == nil || *rj.Spec.Replicas != tc.replicas || *rj.Spec.Replicas < 2 {
				t.Errorf("ramjet replicas %v, want %d (2+)", rj.Spec.Replicas, tc.replicas)
			}
			if rj.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
				t.Errorf("podManagementPolicy %q, want Parallel (no ordered start-up for stateless pods)", rj.Spec.PodManagementPolicy)
			}
			if rj.Spec.UpdateStrategy.Type != appsv1.RollingUpdateStatefulSetStrategyType {
				t.Errorf("updateStrategy %+v, want RollingUpdate", rj.Spec.UpdateStrategy)
			}
			if b.services[rj.Spec.ServiceName] == nil {
				t.Errorf("serviceName %q names no Service", rj.Spec.ServiceName)
			}
			if len(rj.Spec.VolumeClaimTemplates) != 0 {
				t.Error("ramjet pods claim volumes: they keep no state")
			}
			pod := rj.Spec.Template.Spec
			if !selects(t, rj.Spec.Selector, rj.Spec.Template.Labels) {
				t.Error("ramjet selector does not select its pods")
			}
			if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
				t.Error("ramjet pod may run as root")
			}
			if len(pod.Containers) != 1 {
				t.Fatalf("ramjet pod has %d containers", len(pod.Containers))
			}
			c := pod.Containers[0]
			if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem ||
				c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
				t.Error("ramjet container: root filesystem writable or privilege escalation allowed")
			}
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/health" {
				t.Errorf("readiness probe %+v, want GET /health", c.ReadinessProbe)
			}
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil {
				t.Error("no liveness probe")
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v", c.Resources)
			}
			if grace := pod.TerminationGracePeriodSeconds; grace == nil || *grace <= 30+5 {
				t.Errorf("terminationGracePeriodSeconds %v, want > grace_period 30s + preStop 5s", grace)
			}
			env := map[string]corev1.EnvVar{}
			for i, e := range c.Env {
				env[e.Name] = e
				if e.Name == "RJ_ENGINES_SRV" {
					// $(POD_NAMESPACE) expands only if defined earlier.
					if i == 0 || c.Env[0].Name != "POD_NAMESPACE" {
						t.Error("RJ_ENGINES_SRV uses $(POD_NAMESPACE) before it is defined")
					}
				}
			}
			if got := env["RJ_ENGINES_SRV"].Value; got != "_http._tcp.engines.$(POD_NAMESPACE).svc.cluster.local" {
				t.Errorf("RJ_ENGINES_SRV %q", got)
			}
			if e, ok := env["RJ_INSTANCE_ID"]; ok {
				t.Errorf("RJ_INSTANCE_ID set (%+v): the pod's host name, ramjet-<ordinal>, is the id that spreads", e)
			}
			for _, s := range []string{"RJ_UPSTREAM_TOKEN", "RJ_CLIENT_TOKENS", "RJ_ROUTE_ID_SECRET"} {
				if e := env[s]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "" {
					t.Errorf("%s is not read from a Secret: %+v", s, e)
				}
			}
			// The Caddyfile ConfigMap (hashed name) is mounted at
			// /etc/ramjet and holds base/Caddyfile byte for byte.
			var cmName string
			for _, v := range pod.Volumes {
				if v.ConfigMap != nil {
					cmName = v.ConfigMap.Name
				}
			}
			cm := b.configMaps[cmName]
			if cm == nil || !strings.HasPrefix(cmName, "ramjet-caddyfile-") {
				t.Fatalf("ConfigMap %q not rendered (have %v)", cmName, keys(b.configMaps))
			}
			if cm.Data["Caddyfile"] != string(caddyfile) {
				t.Error("ConfigMap Caddyfile differs from base/Caddyfile")
			}
			mounts := map[string]bool{}
			for _, m := range c.VolumeMounts {
				mounts[m.MountPath] = true
			}
			for _, p := range []string{"/etc/ramjet", "/data", "/config"} {
				if !mounts[p] {
					t.Errorf("nothing mounted at %s (read-only root)", p)
				}
			}

			pdb := b.pdbs["ramjet"]
			if pdb == nil || !selects(t, pdb.Spec.Selector, rj.Spec.Template.Labels) || pdb.Spec.MinAvailable == nil {
				t.Errorf("PDB %+v does not keep ramjet pods", pdb)
			}
			svc := b.services["ramjet"]
			if svc == nil || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(rj.Spec.Template.Labels)) {
				t.Error("ramjet Service does not select the ramjet pods")
			}

			// The engines: selected by the headless Service whose port
			// "http" is the SRV name ramjet reads.
			eng := b.deployments[tc.engine]
			if eng == nil {
				t.Fatalf("no engine Deployment %q", tc.engine)
			}
			hs := b.services["engines"]
			if hs == nil || hs.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Fatalf("engines Service not headless: %+v", hs)
			}
			if !labels.SelectorFromSet(hs.Spec.Selector).Matches(labels.Set(eng.Spec.Template.Labels)) {
				t.Error("engines Service does not select the engine pods")
			}
			if labels.SelectorFromSet(hs.Spec.Selector).Matches(labels.Set(rj.Spec.Template.Labels)) {
				t.Error("engines Service selects the ramjet pods")
			}
			if len(hs.Spec.Ports) != 1 || hs.Spec.Ports[0].Name != "http" {
				t.Errorf("engines ports %+v, want one named http", hs.Spec.Ports)
			}
			ec := eng.Spec.Template.Spec.Containers[0]
			if ec.ReadinessProbe == nil {
				t.Error("engines have no readiness probe (a pod that is not ready must leave the SRV answer)")
			}
			hasPort := false
			for _, p := range ec.Ports {
				hasPort = hasPort || p.Name == hs.Spec.Ports[0].TargetPort.String()
			}
			if !hasPort {
				t.Errorf("engine container has no port named %s", hs.Spec.Ports[0].TargetPort.String())
			}
			gpu := ec.Resources.Limits.Name("nvidia.com/gpu", "")
			if tc.gpu != (gpu != nil && gpu.Value() == 1) {
				t.Errorf("engine GPU limit %v, want one GPU: %v", gpu, tc.gpu)
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestMonitoring: the ServiceMonitor scrapes the ramjet Service's metrics
// port, and the PrometheusRule carries exactly the rules promtool checks.
func TestMonitoring(t *testing.T) {
	b := build(t, "monitoring")
	sm := b.monitors["ramjet"]
	if sm == nil || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Fatalf("ServiceMonitor %+v", sm)
	}
	base := build(t, "overlays/simulated")
	if !labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(base.services["ramjet"].Labels)) {
		t.Error("ServiceMonitor does not select the ramjet Service")
	}
	pr := b.rules["ramjet"]
	if pr == nil {
		t.Fatal("no PrometheusRule")
	}
	src, err := os.ReadFile("../prometheus/ramjet-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(src, &want); err != nil {
		t.Fatalf("ramjet-alerts.yml: %v", err)
	}
	if !reflect.DeepEqual(pr.Spec, want) {
		t.Error("monitoring/prometheusrule.yaml differs from deploy/prometheus/ramjet-alerts.yml")
	}
	if n := len(want.Groups[0].Rules); n < 6 {
		t.Errorf("only %d alert rules", n)
	}
}
