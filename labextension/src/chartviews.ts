/**
 * The chart views in JupyterLab's main area: the command that opens one (of a run, or of
 * the machine), their tracker, and their restoration when the page is reloaded.
 */
import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import { MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { lineFormIcon } from '@jupyterlab/ui-components';

import { IChartSource, MachineSource, RunSource } from './chartsources';
import { ChartView } from './chartview';

/** The command that opens a chart view: `{ run: <id> }` for a run, no argument for the machine. */
export const OPEN_CHART = 'ipycloud:open-chart';

export class ChartViews {
  /**
   * @param _app - the application
   * @param _interval - seconds between two requests, at first
   * @param restorer - restores the views that were open when the page is reloaded
   */
  constructor(
    private readonly _app: JupyterFrontEnd,
    private _interval: number,
    restorer: ILayoutRestorer | null
  ) {
    _app.commands.addCommand(OPEN_CHART, {
      label: args =>
        args.run ? `Open the charts of run ${args.run}` : "Open the machine's charts",
      caption:
        "A run's loss, learning rate and metrics, or the machine's GPUs, CPU, RAM, disks, " +
        'network and disk I/O over time',
      icon: lineFormIcon,
      execute: args => this.open(typeof args.run === 'string' ? args.run : null)
    });
    if (restorer) {
      void restorer.restore(this._tracker, {
        command: OPEN_CHART,
        args: widget => widget.content.source.args,
        name: widget => widget.content.source.args.run ?? 'machine'
      });
    }
  }

  /** Seconds between two requests of every view. */
  set interval(seconds: number) {
    this._interval = seconds;
    this._tracker.forEach(widget => (widget.content.interval = seconds));
  }

  /** Show the chart view of a run (by its id), or of the machine for `null`. */
  async open(run: string | null): Promise<MainAreaWidget<ChartView>> {
    const id = `ipycloud-chart-${run ?? 'machine'}`;
    const open = this._tracker.find(widget => widget.id === id);
    if (open) {
      this._app.shell.activateById(id);
      return open;
    }
    const settings = this._app.serviceManager.serverSettings;
    const source: IChartSource = run
      ? new RunSource(run, settings)
      : new MachineSource(settings);
    const content = new ChartView(source, this._interval);
    content.title.label = source.label;
    content.title.icon = lineFormIcon;
    content.title.closable = true;
    const widget = new MainAreaWidget({ content });
    widget.id = id;
    await this._tracker.add(widget);
    this._app.shell.add(widget, 'main');
    this._app.shell.activateById(id);
    return widget;
  }

  private _tracker = new WidgetTracker<MainAreaWidget<ChartView>>({ namespace: 'ipycloud-chart' });
}
