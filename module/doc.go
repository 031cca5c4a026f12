// Package module is the Caddy glue of ramjet: the lb_policy, the request-body
// matcher, handlers, metrics, admin routes and the state kept across reloads.
// It is thin: routing decisions are made by package selection, which knows
// nothing of Caddy; the precise index by package kvindex; the fleet state,
// route ids, snapshots, explain and /health report (package fleetstate),
// the Prometheus collectors (package metrics), the response writer and
// observers (package observe), the client-facing edge (OpenAI errors,
// client auth, header hygiene, allowed paths, the bounded pooled body and
// the sweeper of ended requests) by package edge; the environment checks by
// package envcheck; the engine addresses and per-engine settings by package
// upstream; the dashboard's store (package dashboard), the model catalogue
// (package catalog) and the response usage scanner (package usage) are
// Caddy-free packages it feeds. Only the xcaddy command, bench and tests
// import it.
//
// Modules:
//
//	http.reverse_proxy.selection_policies.ramjet  RamjetSelection (policy.go, knobs.go)
//	http.matchers.ramjet_body                     BodyMatcher (matcher.go)
//	http.handlers.ramjet_observe                  Handler (handler.go)
//	http.handlers.ramjet_guard                    Guard (guard.go)
//	http.handlers.ramjet_models                   Models (models.go)
//	http.handlers.ramjet_health                   Health (health.go)
//	http.handlers.ramjet_dashboard                Dashboard (dashboard.go)
//	admin.api.ramjet                              AdminAPI (admin.go)
//
// The ramjet Caddyfile directive, a shorthand expanding into these
// modules' JSON, is package directive. Caddyfile blocks are read by their
// JSON tags (package caddyblock); an explicit zero of alpha, request_cost,
// tie_epsilon or output_weight is a value (selection.Config.Explicit).
//
// # Internal API for the rest of the package
//
// Per request (request.go): requestState(r) returns the request's
// *reqState, kept in the Caddy vars under VarRequest and shared by the
// matcher, the policy and the handler. After the matcher or Select ran:
//
//	st.readBody(r, limit)   read the body once, bounded (edge.ReadBody);
//	                        st.acquireBody() (then Release), st.bodyErr
//	                        (edge.ErrTooLarge) and a byte-exact r.Body
//	st.features(x, ep)      parsed features (nil on error; st.parse(x, ep)
//	                        returns the *selection.RequestError for a 400)
//	st.fleet, st.slot, st.routeIDHdr (st.routeID()), st.model (observed requests
//	only), st.decision, st.fallback, st.attempts, st.hold (the
//	reservation, a selection.Hold)
//
// A state created by the guard or the ramjet handler is ended by it and
// pooled (recycle: the vars then lead to none); one created first by the
// matcher or a bare policy is ended by the sweeper (openStates).
//
// Fleet state (state.go): lookupFleet(stateKey) returns the *fleet most
// recently provisioned under a state_key ("" = "default"), or nil;
// snapshotFleets() reads them all. A fleet is a *fleetstate.Fleet plus the
// upstream pools of the live policies:
//
//	f.Router()      the *selection.Router (Index(), Load(slot), Config(), Key(slot))
//	f.replicas()    []fleetstate.Replica: key, opaque id, slot, rank, live
//	                reservations, health (known once a policy routed a request)
//	f.RouteID(key)  the opaque X-Ramjet-Upstream id of a replica key
//	f.Detector()    the outlier detector
//
// Replicas are named by selection.ReplicaKey (dial, or dial#rank); model
// names go through the one bounded registry modelNames (a catalog.Names).
//
// Responses (handler.go): the ramjet_observe handler serves each request
// through observe.Serve with its responseObserver (metrics.go), which
// does in order the state's part (X-Ramjet-Upstream, prefill done on the
// first byte), the metrics' and the dashboard's (status, usage) and the
// outlier detector's (outlier.go), then the precise path's observer. With
// ramjet_guard next to it (either side) the two share that one Writer: the
// guard scrubs response headers through it (observe.Writer.SetScrub).
package module
