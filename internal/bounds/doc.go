// Package bounds checks that a setting lies within its bounds and reports
// it as Kubernetes field validation does (field.ErrorList): NonNegative
// for counts, durations and rates (a rate must also be a finite number),
// Within for a closed range. proxy.Options.Validate and main's own flags
// check every bound through it, so that one kind of check reads the same
// everywhere.
package bounds
