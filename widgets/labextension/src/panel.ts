/** The "Research Lab: live" side panel: what lab.overview.snapshot reads, redrawn on each refresh. */
import { Widget } from '@lumino/widgets';

export interface IDashboard {
  id: string;
  label: string;
  caption: string;
  file: string;
  icon: string;
}

export interface ISite {
  name: string;
  testbed: string;
  state: string;
  pending: number | null;
  running: number | null;
  total_cpus: number | null;
  idle_cpus: number | null;
  error: string | null;
}

export interface IRun {
  run_id: string;
  log: string;
  state: string;
  alive: boolean | null;
  step: number;
  steps: number | null;
  loss: number | null;
  val_loss: number | null;
  world_size: number | null;
  age_s: number | null;
}

export interface IService {
  log: string;
  state: string;
  sites: { [name: string]: string };
  waiting: number | null;
  age_s: number | null;
}

export interface ILive {
  time: number;
  sites: ISite[];
  runs: IRun[];
  services: IService[];
  errors: string[];
}

/** Which dashboard a click on an entry opens. */
const OPENS = {
  site: 'federated-sites',
  run: 'training-monitor',
  service: 'federated-sites'
};

function el(
  tag: string,
  cls: string,
  text?: string,
  attrs: { [k: string]: string } = {}
): HTMLElement {
  const node = document.createElement(tag);
  node.className = cls;
  if (text !== undefined) {
    node.textContent = text;
  }
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, v);
  }
  return node;
}

const folder = (path: string) => path.split('/').slice(-2).join('/');

export class LivePanel extends Widget {
  dashboards: IDashboard[] = [];
  private _busy = false;
  private _body: HTMLElement;
  private _status: HTMLElement;

  constructor(
    private _fetch: () => Promise<ILive>,
    private _open: (dashboard: string) => Promise<unknown>
  ) {
    super();
    this.addClass('rl-LivePanel');
    this.node.appendChild(el('h2', 'rl-LivePanel-title', 'Research Lab: live'));
    this._status = el('div', 'rl-LivePanel-status', 'reading…');
    this.node.appendChild(this._status);
    this._body = el('div', 'rl-LivePanel-body');
    this.node.appendChild(this._body);
  }

  /** Refresh once the panel is first shown (the interval then keeps it current). */
  refreshOnShow(): void {
    if (this.isVisible) {
      void this.refresh();
    }
  }

  protected onAfterShow(): void {
    void this.refresh();
  }

  async refresh(): Promise<void> {
    if (this._busy) {
      return;
    }
    this._busy = true;
    try {
      const live = await this._fetch();
      this.render(live);
      const at = new Date(live.time * 1000).toLocaleTimeString();
      this._status.textContent = `updated ${at}`;
      this._status.dataset.time = String(live.time);
      this._status.classList.remove('rl-error');
    } catch (reason) {
      this._status.textContent = `cannot read the lab's state: ${reason}`;
      this._status.classList.add('rl-error');
    } finally {
      this._busy = false;
    }
  }

  private section(title: string, count: number): HTMLElement {
    const sec = el('section', 'rl-LivePanel-section');
    sec.appendChild(el('h3', '', `${title} (${count})`));
    this._body.appendChild(sec);
    return sec;
  }

  private item(
    parent: HTMLElement,
    kind: 'site' | 'run' | 'service',
    name: string,
    state: string,
    detail: string,
    title: string
  ): HTMLElement {
    const row = el('div', `rl-item rl-${kind}`, undefined, {
      'data-name': name,
      'data-state': state,
      title: `${title}\nclick: open the ${OPENS[kind]} dashboard`
    });
    const head = el('div', 'rl-item-head');
    head.appendChild(el('span', 'rl-item-name', name));
    head.appendChild(
      el('span', `rl-badge rl-state-${state.replace(/\s+/g, '-')}`, state)
    );
    row.appendChild(head);
    row.appendChild(el('div', 'rl-item-detail', detail));
    row.addEventListener('click', () => void this._open(OPENS[kind]));
    parent.appendChild(row);
    return row;
  }

  render(live: ILive): void {
    this._body.textContent = '';
    const sites = this.section('Testbed sites', live.sites.length);
    if (!live.sites.length) {
      sites.appendChild(el('div', 'rl-empty', 'no testbed running'));
    }
    for (const s of live.sites) {
      const jobs =
        s.pending === null
          ? s.error ?? 'queue not read'
          : `${s.pending} pending, ${s.running} running · ${s.idle_cpus}/${s.total_cpus} CPUs idle`;
      this.item(sites, 'site', s.name, s.state, jobs, s.testbed);
    }
    const runs = this.section('Training runs', live.runs.length);
    if (!live.runs.length) {
      runs.appendChild(el('div', 'rl-empty', 'no training run logged'));
    }
    for (const r of live.runs) {
      const loss = r.loss === null ? 'no loss yet' : `loss ${r.loss.toFixed(3)}`;
      const target = r.steps === null ? '' : `/${r.steps}`;
      const alive =
        r.alive === null ? '' : r.alive ? ' · process alive' : ' · process gone';
      const row = this.item(
        runs,
        'run',
        r.run_id,
        r.state,
        `step ${r.step}${target} · ${loss}${alive}`,
        r.log
      );
      row.dataset.step = String(r.step);
      row.dataset.alive = String(r.alive);
    }
    const services = this.section('Continuation services', live.services.length);
    if (!live.services.length) {
      services.appendChild(el('div', 'rl-empty', 'no continuation service'));
    }
    for (const s of live.services) {
      const names = Object.entries(s.sites)
        .map(([n, st]) => `${n} ${st}`)
        .join(', ');
      const waiting =
        s.waiting === null ? '' : ` · ${s.waiting} continuation(s) waiting`;
      this.item(services, 'service', folder(s.log), s.state, `${names}${waiting}`, s.log);
    }
    if (live.errors.length) {
      const errs = this.section('Could not read', live.errors.length);
      for (const e of live.errors) {
        errs.appendChild(el('div', 'rl-error', e));
      }
    }
  }
}
