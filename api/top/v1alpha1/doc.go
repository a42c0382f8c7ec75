// Package v1alpha1 is the answer of a watchgate replica's top endpoint
// (Path): the identities each budget tracks, ranked by rejections, watch
// opens or open watches, as `kubectl watchgate top` reads it. It is a
// plain JSON document with a versioned kind, not an API server resource:
// the proxy serves it itself and never forwards its path.
package v1alpha1
