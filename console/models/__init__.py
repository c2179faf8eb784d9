"""Backstop's domain model: nodes, jobs and their operators, replicas, faults, recoveries, metrics
and the versioned fault-tolerance policy.

One module per domain; every model (and the helpers other code and the migrations name) is
re-exported here, so `from console.models import X` works for all of them:

- jobs: Job and its lifecycle, Operator, RegisteredTopology
- replicas: Node, Replica
- faults: FaultInjection, RecoveryEpisode
- metrics: MetricSample
- policy: Policy, PredictorTraining
- decisions: ControlDecision
- reports: ReportSubscription, SentAlert
- upgrades: JobUpgrade
- teams: Team, AuditEvent
- accounts: OidcIdentity (users signed in through OpenID Connect)
- alerting: AlertRoute, Alert, AlertDelivery

Imports run one way (teams <- jobs <- replicas <- faults, metrics; jobs <- decisions, reports,
upgrades; reports <- alerting; policy and accounts alone), and none of these modules imports
console.services or workers.
"""

from console.models.accounts import OidcIdentity
from console.models.alerting import Alert, AlertDelivery, AlertRoute, route_target_error
from console.models.decisions import ControlDecision
from console.models.faults import FaultInjection, RecoveryEpisode
from console.models.jobs import InvalidTransition, Job, Operator, RegisteredTopology
from console.models.metrics import MetricSample, MetricSampleQuerySet
from console.models.policy import Policy, PredictorTraining
from console.models.replicas import Node, Replica
from console.models.reports import (
    ReportSubscription,
    SentAlert,
    default_report_crontab,
    split_recipients,
    validate_recipients,
)
from console.models.teams import AuditEvent, Team
from console.models.upgrades import JobUpgrade

__all__ = [
    "Alert",
    "AlertDelivery",
    "AlertRoute",
    "AuditEvent",
    "ControlDecision",
    "FaultInjection",
    "InvalidTransition",
    "Job",
    "JobUpgrade",
    "MetricSample",
    "MetricSampleQuerySet",
    "Node",
    "OidcIdentity",
    "Operator",
    "Policy",
    "PredictorTraining",
    "RecoveryEpisode",
    "RegisteredTopology",
    "Replica",
    "ReportSubscription",
    "SentAlert",
    "Team",
    "default_report_crontab",
    "route_target_error",
    "split_recipients",
    "validate_recipients",
]
