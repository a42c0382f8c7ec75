// Package periodic runs a function at an interval measured on a clock the
// caller passes (k8s.io/utils/clock), so that the background loops of the
// proxy (the engine's sweep, the upstream probe, the service-account key
// refresh) and of the injector (the CA file's re-read) all honour the clock
// they are given, and a test drives them with a fake one.
package periodic
