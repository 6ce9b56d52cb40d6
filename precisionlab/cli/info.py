"""precisionlab info: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations


from precisionlab.cli.options import JsonOpt


def command(json_out: JsonOpt = False):
    """Everything that decides the numbers on this machine: versions, GPU, library, precision flags."""
    from precisionlab.report import info as info_report
    from precisionlab.report.output import Output
    from precisionlab.experiments import info as exp

    Output(info_report, json_out).show(exp.run())
