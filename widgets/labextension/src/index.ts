/**
 * The research-lab JupyterLab extension.
 *
 * - A "Research Lab" launcher section, command-palette category and main-menu entry with one
 *   item per dashboard template the server extension lists (GET research-lab/dashboards); each
 *   saves a fresh copy of its template in the file browser's folder (POST
 *   research-lab/dashboards/<id>) and opens it.
 * - A left side panel, "Research Lab: live", listing the testbed sites, training runs and
 *   continuation services the server finds (GET research-lab/live, lab.overview.snapshot),
 *   refreshed every few seconds without reloading; a click on an entry opens the matching
 *   dashboard.
 *
 * Every request goes through ServerConnection (the server's base_url, token and XSRF cookie).
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ILauncher } from '@jupyterlab/launcher';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { LabIcon } from '@jupyterlab/ui-components';
import { Menu } from '@lumino/widgets';

import { ICONS } from './icons';
import { IDashboard, ILive, LivePanel } from './panel';
import { requestAPI } from './request';

const CATEGORY = 'Research Lab';
const OPEN = 'research-lab:open-dashboard';
const SHOW_LIVE = 'research-lab:show-live';
const REFRESH_MS = 2000;

const icons: { [key: string]: LabIcon } = {};
for (const [name, svg] of Object.entries(ICONS)) {
  icons[name] = new LabIcon({ name: `research-lab:${name}`, svgstr: svg });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'research-lab:plugin',
  description:
    'Research Lab launcher section, menu and commands for the dashboards, and the live side panel.',
  autoStart: true,
  optional: [
    ILauncher,
    ICommandPalette,
    IMainMenu,
    IDefaultFileBrowser,
    ILayoutRestorer
  ],
  activate: async (
    app: JupyterFrontEnd,
    launcher: ILauncher | null,
    palette: ICommandPalette | null,
    mainMenu: IMainMenu | null,
    browser: IDefaultFileBrowser | null,
    restorer: ILayoutRestorer | null
  ) => {
    if (app.name !== 'JupyterLab') {
      // Voila (and other Lumino front ends) load every prebuilt extension; the launcher, menu and
      // side panel belong to JupyterLab, whose server runs research_lab_ext.
      return;
    }
    const settings = app.serviceManager.serverSettings;
    let dashboards: IDashboard[] = [];
    const byId = (id: string) => dashboards.find(d => d.id === id);

    app.commands.addCommand(OPEN, {
      label: args => byId(args.id as string)?.label ?? 'Open a dashboard',
      caption: args =>
        byId(args.id as string)?.caption ?? 'A fresh copy of a dashboard',
      icon: args => icons[byId(args.id as string)?.icon ?? 'chart'],
      execute: async args => {
        const id = args.id as string;
        const dir = browser?.model.path ?? '';
        const made = await requestAPI<{ path: string }>(
          `dashboards/${encodeURIComponent(id)}`,
          settings,
          { method: 'POST', body: JSON.stringify({ dir }) }
        );
        await browser?.model.refresh();
        return app.commands.execute('docmanager:open', {
          path: made.path,
          factory: 'Notebook'
        });
      }
    });

    const panel = new LivePanel(
      () => requestAPI<ILive>('live', settings),
      id => app.commands.execute(OPEN, { id })
    );
    panel.id = 'research-lab-live';
    panel.title.icon = icons['lab'];
    panel.title.caption = 'Research Lab: live sites, runs and services';
    app.shell.add(panel, 'left', { rank: 650 });
    restorer?.add(panel, 'research-lab-live');
    window.setInterval(() => {
      if (panel.isVisible) {
        void panel.refresh();
      }
    }, REFRESH_MS);
    panel.refreshOnShow();

    app.commands.addCommand(SHOW_LIVE, {
      label: 'Live sites, runs and services',
      caption: 'Show the Research Lab side panel',
      icon: icons['lab'],
      execute: () => app.shell.activateById(panel.id)
    });

    try {
      dashboards = await requestAPI<IDashboard[]>('dashboards', settings);
    } catch (reason) {
      console.error(
        `research-lab: the research_lab_ext server extension did not answer.\n${reason}`
      );
      return;
    }
    panel.dashboards = dashboards;

    const menu = new Menu({ commands: app.commands });
    menu.title.label = CATEGORY;
    menu.id = 'research-lab-menu';
    dashboards.forEach((d, rank) => {
      launcher?.add({
        command: OPEN,
        args: { id: d.id },
        category: CATEGORY,
        rank
      });
      palette?.addItem({ command: OPEN, args: { id: d.id }, category: CATEGORY });
      menu.addItem({ command: OPEN, args: { id: d.id } });
    });
    menu.addItem({ type: 'separator' });
    menu.addItem({ command: SHOW_LIVE });
    palette?.addItem({ command: SHOW_LIVE, category: CATEGORY });
    mainMenu?.addMenu(menu, true, { rank: 1000 });
  }
};

export default plugin;
