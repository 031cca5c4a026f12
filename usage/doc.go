// Package usage reads the token accounting an engine reports in a
// response's "usage" object (prompt, cached prompt and completion tokens;
// chat and text completions and the Responses API) from a JSON or
// server-sent-events body as it streams past, without buffering it and in
// bounded memory. Package module feeds it every response chunk for the
// metrics and the dashboard.
package usage
