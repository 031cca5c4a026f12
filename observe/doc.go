// Package observe watches HTTP responses as they stream to the client,
// with net/http only: Writer wraps an http.ResponseWriter and feeds every
// Observer the final status, each chunk of body and the end of the
// response, passes flushes (server-sent events stream unbuffered),
// hijacking and http.ResponseController through, and can end a cut SSE
// stream with a final error event.
//
// Package module's ramjet_observe handler wraps the response of every
// request routed by ramjet in a Writer, with the observers that mark the
// prefill done, count the metrics and report outcomes to the outlier
// detector.
package observe
