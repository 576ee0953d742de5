# Renames of issue 48, item 5. Apply with: sed -i -f RENAMES.sed FILE... (order matters: specific lines first).
# 1. views/ split into text/, readers/ and attestations/
s/reconciler\.views\.status_reader\b/reconciler.readers.status_reader/g
s#reconciler/views/status_reader\b#reconciler/readers/status_reader#g
s/\bviews\.status_reader\b/readers.status_reader/g
s#\bviews/status_reader\b#readers/status_reader#g
s/reconciler\.views\.fleet_reader\b/reconciler.readers.fleet_reader/g
s#reconciler/views/fleet_reader\b#reconciler/readers/fleet_reader#g
s/\bviews\.fleet_reader\b/readers.fleet_reader/g
s#\bviews/fleet_reader\b#readers/fleet_reader#g
s/reconciler\.views\.attestation_check\b/reconciler.attestations.attestation_check/g
s#reconciler/views/attestation_check\b#reconciler/attestations/attestation_check#g
s/\bviews\.attestation_check\b/attestations.attestation_check/g
s#\bviews/attestation_check\b#attestations/attestation_check#g
s/reconciler\.views\.attestation\b/reconciler.attestations.attestation/g
s#reconciler/views/attestation\b#reconciler/attestations/attestation#g
s/\bviews\.attestation\b/attestations.attestation/g
s#\bviews/attestation\b#attestations/attestation#g
s/reconciler\.views\.evidence_check\b/reconciler.attestations.evidence_check/g
s#reconciler/views/evidence_check\b#reconciler/attestations/evidence_check#g
s/\bviews\.evidence_check\b/attestations.evidence_check/g
s#\bviews/evidence_check\b#attestations/evidence_check#g
s/reconciler\.views\.artifact_text\b/reconciler.text.artifact_text/g
s#reconciler/views/artifact_text\b#reconciler/text/artifact_text#g
s/\bviews\.artifact_text\b/text.artifact_text/g
s#\bviews/artifact_text\b#text/artifact_text#g
s/reconciler\.views\.dashboard_comparisons\b/reconciler.text.dashboard_comparisons/g
s#reconciler/views/dashboard_comparisons\b#reconciler/text/dashboard_comparisons#g
s/\bviews\.dashboard_comparisons\b/text.dashboard_comparisons/g
s#\bviews/dashboard_comparisons\b#text/dashboard_comparisons#g
s/reconciler\.views\.dashboard\b/reconciler.text.dashboard/g
s#reconciler/views/dashboard\b#reconciler/text/dashboard#g
s/\bviews\.dashboard\b/text.dashboard/g
s#\bviews/dashboard\b#text/dashboard#g
s/reconciler\.views\.eval_text\b/reconciler.text.eval_text/g
s#reconciler/views/eval_text\b#reconciler/text/eval_text#g
s/\bviews\.eval_text\b/text.eval_text/g
s#\bviews/eval_text\b#text/eval_text#g
s/reconciler\.views\.evidence_marks\b/reconciler.text.evidence_marks/g
s#reconciler/views/evidence_marks\b#reconciler/text/evidence_marks#g
s/\bviews\.evidence_marks\b/text.evidence_marks/g
s#\bviews/evidence_marks\b#text/evidence_marks#g
s/reconciler\.views\.fleet_text\b/reconciler.text.fleet_text/g
s#reconciler/views/fleet_text\b#reconciler/text/fleet_text#g
s/\bviews\.fleet_text\b/text.fleet_text/g
s#\bviews/fleet_text\b#text/fleet_text#g
s/reconciler\.views\.health_text\b/reconciler.text.health_text/g
s#reconciler/views/health_text\b#reconciler/text/health_text#g
s/\bviews\.health_text\b/text.health_text/g
s#\bviews/health_text\b#text/health_text#g
s/reconciler\.views\.markdown\b/reconciler.text.markdown/g
s#reconciler/views/markdown\b#reconciler/text/markdown#g
s/\bviews\.markdown\b/text.markdown/g
s#\bviews/markdown\b#text/markdown#g
s/reconciler\.views\.notification_events\b/reconciler.text.notification_events/g
s#reconciler/views/notification_events\b#reconciler/text/notification_events#g
s/\bviews\.notification_events\b/text.notification_events/g
s#\bviews/notification_events\b#text/notification_events#g
s/reconciler\.views\.plan\b/reconciler.text.plan/g
s#reconciler/views/plan\b#reconciler/text/plan#g
s/\bviews\.plan\b/text.plan/g
s#\bviews/plan\b#text/plan#g
s/reconciler\.views\.settings_changes\b/reconciler.text.settings_changes/g
s#reconciler/views/settings_changes\b#reconciler/text/settings_changes#g
s/\bviews\.settings_changes\b/text.settings_changes/g
s#\bviews/settings_changes\b#text/settings_changes#g
s/reconciler\.views\.status_text\b/reconciler.text.status_text/g
s#reconciler/views/status_text\b#reconciler/text/status_text#g
s/\bviews\.status_text\b/text.status_text/g
s#\bviews/status_text\b#text/status_text#g
s/reconciler\.views\.web_answers\b/reconciler.text.web_answers/g
s#reconciler/views/web_answers\b#reconciler/text/web_answers#g
s/\bviews\.web_answers\b/text.web_answers/g
s#\bviews/web_answers\b#text/web_answers#g
s/reconciler\.views\.web_numbers\b/reconciler.text.web_numbers/g
s#reconciler/views/web_numbers\b#reconciler/text/web_numbers#g
s/\bviews\.web_numbers\b/text.web_numbers/g
s#\bviews/web_numbers\b#text/web_numbers#g
s/reconciler\.views\.web_page\b/reconciler.text.web_page/g
s#reconciler/views/web_page\b#reconciler/text/web_page#g
s/\bviews\.web_page\b/text.web_page/g
s#\bviews/web_page\b#text/web_page#g
s/reconciler\.views\.web_plots\b/reconciler.text.web_plots/g
s#reconciler/views/web_plots\b#reconciler/text/web_plots#g
s/\bviews\.web_plots\b/text.web_plots/g
s#\bviews/web_plots\b#text/web_plots#g
s/reconciler\.views\.web_rollout\b/reconciler.text.web_rollout/g
s#reconciler/views/web_rollout\b#reconciler/text/web_rollout#g
s/\bviews\.web_rollout\b/text.web_rollout/g
s#\bviews/web_rollout\b#text/web_rollout#g
s/from reconciler\.views import \(status_reader\|fleet_reader\)\b/from reconciler.readers import \1/g
s/from reconciler\.views import \(attestation\|attestation_check\|evidence_check\)\b/from reconciler.attestations import \1/g
# every other module imported as 'from reconciler.views import X' is a text module
s/from reconciler\.views import/from reconciler.text import/g
# 2. daemon/canary_verdicts.py keeps soaks and reads the canary's measurements; the engine decides verdicts
s/reconciler\.daemon\.canary_verdicts\b/reconciler.daemon.canary_readings/g
s#reconciler/daemon/canary_verdicts\b#reconciler/daemon/canary_readings#g
s/\bdaemon\.canary_verdicts\b/daemon.canary_readings/g
s#\bdaemon/canary_verdicts\b#daemon/canary_readings#g
s/from reconciler\.daemon import canary_verdicts\b/from reconciler.daemon import canary_readings/g
s/\bcanary_verdicts\.\(py\|_due\|judge_all\|SoakMemory\|CanaryVerdicts\)\b/canary_readings.\1/g
s/``canary_verdicts``/``canary_readings``/g
s/`canary_verdicts`/`canary_readings`/g
s/\bCanaryVerdicts\b/CanaryReadings/g
# 3. the two resolve_nodes: engine.selection's is the rule over the nodes it is given (select_nodes);
#    engine.starts's (re-exported by engine.step) hands it only the candidates from the fleet's label index
#    (select_nodes_by_index). A file importing resolve_nodes from engine.selection calls select_nodes: fix its calls by hand.
s/selection\.resolve_nodes\b/selection.select_nodes/g
s/\(from reconciler\.engine\.selection import .*\)\bresolve_nodes\b/\1select_nodes/g
s/\bresolve_nodes\b/select_nodes_by_index/g
# 4. the pure statistics leave the daemon for a pure package of their own
s/reconciler\.daemon\.canary_statistics\b/reconciler.statistics.canary_statistics/g
s#reconciler/daemon/canary_statistics\b#reconciler/statistics/canary_statistics#g
s/from reconciler\.daemon import canary_statistics\b/from reconciler.statistics import canary_statistics/g
s#\bdaemon/canary_statistics\b#statistics/canary_statistics#g
# 5. the simulated fleet leaves the product's node package for reconciler/simulation/
s/from reconciler\.node import simulated_fleet\b/from reconciler.simulation import fleet as simulated_fleet/g
s/from reconciler\.node import simulated_download\b/from reconciler.simulation import download as simulated_download/g
s/reconciler\.node\.simulated_fleet\b/reconciler.simulation.fleet/g
s/reconciler\.node\.simulated_download\b/reconciler.simulation.download/g
s#reconciler/node/simulated_fleet\b#reconciler/simulation/fleet#g
s#reconciler/node/simulated_download\b#reconciler/simulation/download#g
s#\bnode/simulated_fleet\.py\b#simulation/fleet.py#g
s#\bnode/simulated_download\.py\b#simulation/download.py#g
