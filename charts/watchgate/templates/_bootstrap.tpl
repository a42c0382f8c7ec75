{{/*
watchgate.bootstrapBudgets is the JSON of --bootstrap-budgets: the budgets
the leader keeps in place (controllers.BootstrapReconciler). The chart
creates no WatchBudget itself: Helm would have to wait for the CRD it
creates in the same release (a hook), and every upgrade would re-create
the budgets, dropping an operator's edits, their status and their
suggestion. Mandatory: the Exempt budget (watchgate's own account, the
control plane's, exemptBudget.subjects), restored when deleted or edited.
Suggested: the catch-all and the agents budget, kept as these values say
until an operator takes one over (watchgate.io/autoupdate-spec: "false").
*/}}
{{- define "watchgate.bootstrapBudgets" -}}
{{- $fullname := include "watchgate.fullname" . -}}
{{- $labels := dict "app.kubernetes.io/name" (include "watchgate.name" .) "app.kubernetes.io/instance" .Release.Name "app.kubernetes.io/part-of" "watchgate" "app.kubernetes.io/managed-by" "watchgate" -}}
{{- $budgets := list -}}
{{- with .Values.exemptBudget }}
{{- if .enabled }}
{{- $own := dict "kind" "ServiceAccount" "namespace" $.Release.Namespace "name" (include "watchgate.serviceAccountName" $) -}}
{{- $controlPlane := list (dict "kind" "User" "name" "system:apiserver") (dict "kind" "User" "name" "system:kube-controller-manager") (dict "kind" "User" "name" "system:kube-scheduler") (dict "kind" "ServiceAccount" "namespace" "kube-system" "name" "*") -}}
{{- $subjects := concat (list $own) $controlPlane (required "exemptBudget.subjects must not be empty" .subjects) -}}
{{- $spec := dict "enforcement" "Exempt" "precedence" 1 "impersonation" "Any" "resources" (list) "subjects" $subjects -}}
{{- $budgets = append $budgets (dict "name" (.name | default (printf "%s-exempt" $fullname)) "mandatory" true "labels" $labels "spec" $spec) -}}
{{- end }}
{{- end }}
{{- with .Values.agentsBudget }}
{{- if .enabled }}
{{- $spec := dict "enforcement" .enforcement "precedence" .precedence "impersonation" "Direct" "subjects" (required "agentsBudget.subjects must not be empty" .subjects) "limits" .limits "backoff" .backoff "staleVersions" .staleVersions "suggestion" .suggestion -}}
{{- if .aggregate }}
{{- $_ := set $spec "aggregate" .aggregate -}}
{{- end }}
{{- $budgets = append $budgets (dict "name" (.name | default (printf "%s-agents" $fullname)) "labels" $labels "spec" $spec) -}}
{{- end }}
{{- end }}
{{- with .Values.defaultBudget }}
{{- if .enabled }}
{{- $spec := dict "enforcement" .enforcement "precedence" .precedence "limits" .limits "backoff" .backoff "staleVersions" .staleVersions "suggestion" .suggestion -}}
{{- with .subjects }}{{ $_ := set $spec "subjects" . }}{{ end -}}
{{- with .resources }}{{ $_ := set $spec "resources" . }}{{ end -}}
{{- $budgets = append $budgets (dict "name" (.name | default (printf "%s-default" $fullname)) "labels" $labels "spec" $spec) -}}
{{- end }}
{{- end }}
{{- toJson $budgets -}}
{{- end }}
