// Reads a JSON-lines file chosen in the browser (a File), streaming: any size, gzip too
// (name ending in .gz). Yields parsed objects; bad lines are counted, not fatal.

export async function* readJsonLines(file, stats = { bad: 0, lines: 0 }) {
  let stream = file.stream();
  if (/\.gz$/i.test(file.name) && typeof DecompressionStream !== "undefined") {
    stream = stream.pipeThrough(new DecompressionStream("gzip"));
  }
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let rest = "";
  for (;;) {
    const { value, done } = await reader.read();
    const text = done ? rest : rest + value;
    const lines = text.split("\n");
    rest = done ? "" : lines.pop();
    for (const line of lines) {
      const s = line.trim();
      if (!s) continue;
      stats.lines++;
      try {
        yield JSON.parse(s);
      } catch {
        stats.bad++;
      }
    }
    if (done) return;
  }
}
