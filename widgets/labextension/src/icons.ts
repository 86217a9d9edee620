/** Inline SVG icons (no request for them): one per dashboard kind, and the lab's own. */
const svg = (body: string) =>
  `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16" height="16"><g class="jp-icon3" fill="#616161">${body}</g></svg>`;

export const ICONS: { [name: string]: string } = {
  lab: svg(
    '<path d="M9 2h6v2h-1v5.2l5.6 9.3A2 2 0 0 1 17.9 22H6.1a2 2 0 0 1-1.7-3.5L10 9.2V4H9z M8.3 15h7.4l-2.7-4.5V5h-2v5.5z"/>'
  ),
  queue: svg(
    '<rect x="3" y="4" width="18" height="3" rx="1"/><rect x="3" y="10.5" width="12" height="3" rx="1"/><rect x="3" y="17" width="7" height="3" rx="1"/>'
  ),
  sites: svg(
    '<rect x="2" y="3" width="9" height="7" rx="1"/><rect x="13" y="3" width="9" height="7" rx="1"/><rect x="2" y="14" width="9" height="7" rx="1"/><rect x="13" y="14" width="9" height="7" rx="1"/>'
  ),
  graph: svg(
    '<circle cx="5" cy="12" r="3"/><circle cx="19" cy="5" r="3"/><circle cx="19" cy="19" r="3"/><path d="M7 11l10-5.5.8 1.4-10 5.5zM7 13l10 5.5-.8 1.4-10-5.5z"/>'
  ),
  chart: svg(
    '<path d="M3 3h2v16h16v2H3z"/><path d="M6 16l4.5-6 3.5 3 5-7 1.6 1.2-6.2 8.6-3.5-3-3.3 4.4z"/>'
  ),
  image: svg(
    '<path d="M3 4h18a1 1 0 0 1 1 1v14a1 1 0 0 1-1 1H3a1 1 0 0 1-1-1V5a1 1 0 0 1 1-1zm1 2v10l5-5 4 4 3-3 4 4V6zm12 1.5a2 2 0 1 1 0 4 2 2 0 0 1 0-4z"/>'
  ),
  video: svg(
    '<path d="M3 5h13a1 1 0 0 1 1 1v3.5l5-3v11l-5-3V18a1 1 0 0 1-1 1H3a1 1 0 0 1-1-1V6a1 1 0 0 1 1-1z"/>'
  )
};
