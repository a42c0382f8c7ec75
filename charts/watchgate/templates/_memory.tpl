{{/*
watchgate.goMemLimit is GOMEMLIMIT for the container: memory.goMemLimitPercent
of resources.limits.memory, in MiB (e.g. 512Mi at 90% → "460MiB"), so that
the Go collector works harder before the kernel would kill the pod, and the
watch guard (--memory-high-water-percent) refuses new watches before that.
Empty when there is no memory limit or goMemLimitPercent is 0. The limit is
an integer with an optional binary (Ki, Mi, Gi, Ti) or decimal (k, M, G, T)
suffix; anything else fails the render.
*/}}
{{- define "watchgate.goMemLimit" -}}
{{- $pct := int .Values.memory.goMemLimitPercent -}}
{{- with .Values.resources.limits.memory -}}
{{- if gt $pct 0 -}}
{{- $q := toString . -}}
{{- $num := regexFind "^[0-9]+" $q -}}
{{- $suffix := trimPrefix $num $q -}}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- if or (eq $num "") (not (hasKey $units $suffix)) -}}
{{- fail (printf "resources.limits.memory %q: write it as an integer with Ki, Mi, Gi, Ti, k, M, G or T (or set memory.goMemLimitPercent: 0 and GOMEMLIMIT in extraEnv)" $q) -}}
{{- end -}}
{{- $mib := div (mul (int64 $num) (int64 (get $units $suffix)) $pct) (mul 100 1048576) -}}
{{- if lt (int64 $mib) 1 -}}
{{- fail (printf "resources.limits.memory %q × memory.goMemLimitPercent %d%% is under 1 MiB" $q $pct) -}}
{{- end -}}
{{- printf "%dMiB" (int64 $mib) -}}
{{- end -}}
{{- end -}}
{{- end -}}
