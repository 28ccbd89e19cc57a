# The report's front page (docs/architecture.md, "Report"): the verdict of the run, embedded by
# workflows/report/workflow.rst. Its inputs are everything it shows: each study's claims, run
# summary and provenance sidecars, and the committed GPU records shown beside them (a new or changed
# record reruns it).
# Uses (from the Snakefile): CONFIG, RESULTS, STUDY_SPECS, GPU_RECORDS, CONDA_ENV, wiring, gpu_records,
# write_verdict.
rule verdict:
    input:
        wiring.verdict_inputs(RESULTS, list(STUDY_SPECS.values()), CONFIG),
        gpu_records.record_inputs(GPU_RECORDS, list(STUDY_SPECS)),
    output:
        f"{RESULTS}/verdict.html",
    params:
        studies={name: spec.title for name, spec in STUDY_SPECS.items()},
        gpu_records=GPU_RECORDS,
    log:
        f"{RESULTS}/logs/verdict.log",
    localrule: True
    conda:
        CONDA_ENV
    run:
        write_verdict(RESULTS, params.studies, output[0], params.gpu_records)
