// Reads Mermaid text on stdin and parses it with mermaid's own parser, as
// mermaid.js in a forge's page would; prints what it understood as JSON
// (subgraphs in order, boxes with their classes, links), or the parse
// error on stderr with exit code 1. jsdom stands in for the browser's DOM,
// which mermaid's sanitizer needs.
import { JSDOM } from 'jsdom';
import fs from 'fs';

const dom = new JSDOM('<!doctype html><html><body></body></html>');
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import('mermaid');

const text = fs.readFileSync(0, 'utf8');
try {
  await mermaid.parse(text);
  const db = (await mermaid.mermaidAPI.getDiagramFromText(text)).db;
  console.log(JSON.stringify({
    subgraphs: db.getSubGraphs().map((s) => ({ id: s.id, title: s.title, nodes: s.nodes })),
    boxes: [...db.getVertices().values()].map((v) => ({ id: v.id, text: v.text, classes: v.classes, styles: v.styles })),
    links: db.getEdges().map((e) => ({ start: e.start, end: e.end, stroke: e.stroke })),
    classes: [...db.getClasses().keys()],
  }));
} catch (error) {
  console.error(String(error.message || error));
  process.exit(1);
}
