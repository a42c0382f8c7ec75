// Package inject puts in-cluster agents behind watchgate with one label.
//
// It has three pieces, wired by SetupWithManager:
//
//   - PodInjector, a mutating admission webhook for Pods (served by
//     controller-runtime's webhook server on its own port). A pod is routed
//     when it, or else its namespace, carries the label
//     watchgate.io/inject=enabled; the pod label wins, and "disabled" opts a
//     pod out. Routing a pod (see Route) points KUBERNETES_SERVICE_HOST and
//     KUBERNETES_SERVICE_PORT of every container at watchgate's Service and
//     replaces the service-account volume the API server's ServiceAccount
//     admission plugin added (kube-api-access-*) by an equivalent projected
//     volume at the same path whose ca.crt is watchgate's CA. Pods that mount
//     their own token, use the host network or set their own API server are
//     left alone, with an annotation saying why. Routing is idempotent.
//     The webhook's failurePolicy is Ignore: when watchgate is down, pods
//     are created unrouted and talk to the API server directly.
//     What one review may cost is bounded (AdmissionLimits, review.go): a
//     body over 3 MiB gets 413 unread, a review that finds none of the two
//     slots within a second 429, both failed calls for failurePolicy; the
//     pod is decoded as podSubset (podsubset.go), only the fields routing
//     reads, and the JSON patch is written from what routing changed.
//   - CAPublisher (leader only), like kube-controller-manager's
//     kube-root-ca.crt publisher: it keeps the ConfigMap watchgate-root-ca.crt
//     (key ca.crt) in every namespace that has the label or routed pods, and
//     in watchgate's own (Options.PublishTo, where `kubectl watchgate top`
//     reads it), and
//     rewrites it when the CA file (--ca-file) changes; kubelet refreshes the
//     projected file, so clients trust a rotated CA without a restart.
//   - UnroutedPods (leader only, unrouted.go): a pod that asked for routing
//     and was admitted without the webhook's answer (failurePolicy Ignore
//     while no replica answered) gets a Warning Event NotRouted and is
//     counted in watchgate_inject_unrouted_pods(_total). It lists pods'
//     metadata a page at a time when it starts and then watches them,
//     keeping only the unrouted pods' UIDs.
//
// Both read from the injector's own cache (newLocalCache): namespaces' and
// labelled pods' metadata, names and labels only, and the ConfigMaps named
// watchgate-root-ca.crt; nothing else of the cluster. The cache runs on
// every replica, like the webhook server that reads it (replicaCache):
// kube-apiserver calls whichever replica its connection reaches.
//
// Which names the webhook never routes: kube-system and watchgate's own
// namespace, whatever their labels say (its configuration also excludes
// them, so the API server does not even call it).
//
// Route and the patch it becomes are pure and unit tested (the patch of
// the subset, applied to the whole pod, is Route of the whole pod); the
// webhook and the publisher are tested against a real kube-apiserver in
// test/inject, with the flood of admission reviews the heap bound is
// measured on.
package inject
