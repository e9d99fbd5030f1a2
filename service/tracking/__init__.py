"""MLflow for the service and the flows, with one failure policy: a call the tracking store cannot
take now is journaled on local disk and replayed in order once it can (``buffered``).

``service_runs`` (the service's runs, on a thread of their own), ``experiment`` and ``failures``
import MLflow only when used, so importing this room costs the service nothing; ``buffered`` and
``journal`` are the shared core that ``flows.recording.tracking`` builds on.
"""

from service.tracking.experiment import ensure_experiment
from service.tracking.service_runs import ServiceTracking, service_journal

__all__ = ["ServiceTracking", "ensure_experiment", "service_journal"]
