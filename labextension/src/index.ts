/**
 * ipycloud in JupyterLab and Notebook 7: the server's GPUs, CPU, RAM and kernels in the
 * status bar (Notebook 7: its top bar), in a side panel, and in notifications.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  IToolbarWidgetRegistry,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { Alerts } from './alerts';
import { IKernel } from './api';
import { ChartViews, OPEN_CHART } from './chartviews';
import { gaugeIcon } from './icon';
import { kernelName } from './kernels';
import { ResourceMonitor } from './monitor';
import { PANEL_ID, ResourcePanel } from './panel';
import { RunsSection } from './runs';
import { DEFAULT_OPTIONS, IOptions, readOptions } from './settings';
import { StatusItem } from './statusitem';

const PLUGIN_ID = 'ipycloud:plugin';

/** The command that opens the panel. */
const OPEN_PANEL = 'ipycloud:open-panel';

/** The item's name in the `TopBar` toolbar of schema/plugin.json. */
const TOP_BAR_ITEM = 'ipycloud-resources';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: "The Jupyter server's GPUs, RAM and kernels, from ipycloud's server extension.",
  autoStart: true,
  optional: [
    IStatusBar,
    ISettingRegistry,
    ICommandPalette,
    IToolbarWidgetRegistry,
    ILayoutRestorer
  ],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    settingRegistry: ISettingRegistry | null,
    palette: ICommandPalette | null,
    toolbarRegistry: IToolbarWidgetRegistry | null,
    restorer: ILayoutRestorer | null
  ): void => {
    let options: IOptions = { ...DEFAULT_OPTIONS };
    const monitor = new ResourceMonitor(
      app.serviceManager.serverSettings,
      options.refreshInterval
    );
    const openPanel = () => void app.commands.execute(OPEN_PANEL);

    const charts = new ChartViews(app, options.refreshInterval, restorer);
    const runs = new RunsSection(app.serviceManager.serverSettings, run =>
      void charts.open(run.id)
    );
    const panel = new ResourcePanel(
      monitor,
      options,
      kernel => void shutDown(app, kernel).then(() => monitor.refreshKernels()),
      runs,
      () => void charts.open(null)
    );
    panel.title.icon = gaugeIcon;
    app.shell.add(panel, 'right', { rank: 900 });
    restorer?.add(panel, PANEL_ID);

    app.commands.addCommand(OPEN_PANEL, {
      label: 'Open resource panel',
      caption: "The server's GPUs, CPU, RAM, disks and kernels",
      icon: gaugeIcon,
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: OPEN_PANEL, category: 'ipycloud' });
    palette?.addItem({ command: OPEN_CHART, category: 'ipycloud' });

    const item = new StatusItem(monitor, options, openPanel);
    item.id = 'ipycloud-status';
    if (statusBar) {
      statusBar.registerStatusItem('ipycloud:status', { item, align: 'left', rank: 100 });
    }
    // Notebook 7 has no status bar: there the item goes into the top bar. JupyterLab has
    // both; there the top bar's place stays empty.
    toolbarRegistry?.addFactory('TopBar', TOP_BAR_ITEM, () => {
      if (!statusBar) {
        return item;
      }
      const placeholder = new Widget();
      placeholder.hide();
      return placeholder;
    });

    const alerts = new Alerts(openPanel);
    let alerted = 0;
    monitor.changed.connect(() => {
      const latest = monitor.latest;
      if (latest && latest.time > alerted) {
        alerted = latest.time;
        alerts.checkReading(latest, options);
      }
    });
    monitor.newEvents.connect((_, events) => alerts.notifyEvents(events, options));

    const apply = (next: IOptions) => {
      options = next;
      monitor.interval = options.refreshInterval;
      runs.interval = options.refreshInterval;
      charts.interval = options.refreshInterval;
      monitor.watch('events', 'notifications', options.notifications);
      item.options = options;
      panel.options = options;
    };
    const start = () => {
      apply(options);
      monitor.start();
    };
    if (!settingRegistry) {
      start();
      return;
    }
    settingRegistry
      .load(PLUGIN_ID)
      .then(settings => {
        options = readOptions(settings);
        settings.changed.connect(() => apply(readOptions(settings)));
      })
      .catch(reason => console.warn('ipycloud: settings not loaded, using defaults', reason))
      .finally(start);
  }
};

/** Ask, then shut a kernel down through JupyterLab's own kernel manager. */
async function shutDown(app: JupyterFrontEnd, kernel: IKernel): Promise<void> {
  const name = kernelName(kernel);
  const answer = await showDialog({
    title: 'Shut down the kernel?',
    body: `The kernel of ${name} stops, and every variable it holds is lost.`,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Shut Down' })]
  });
  if (!answer.button.accept) {
    return;
  }
  try {
    await app.serviceManager.kernels.shutdown(kernel.id);
  } catch (error) {
    await showErrorMessage(`The kernel of ${name} was not shut down`, error as Error);
  }
}

export default plugin;
