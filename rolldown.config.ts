import { defineConfig } from 'rolldown';

/**
 * The `tollgate` command as it ships: cmd/tollgate.ts and everything it imports, dependencies included,
 * in one entry file and a few chunks that load when their command needs them (the operator, the
 * embedded database, tracing, Stripe). A process loads a few dozen files instead of ~1 300 modules, which
 * keeps about 20 MB less resident (docs/benchmarks.md, "One file to load").
 *
 * PGlite stays in node_modules: it loads its WebAssembly and data files from beside its own module.
 */
export default defineConfig({
  input: { tollgate: 'cmd/tollgate.ts' },
  platform: 'node',
  external: [/^@electric-sql\/pglite(\/|$)/],
  output: {
    dir: 'dist/bin',
    format: 'esm',
    sourcemap: true,
    minify: { compress: true, mangle: false, codegen: { removeWhitespace: true } },
    entryFileNames: '[name].js',
    chunkFileNames: 'chunks/[name]-[hash].js',
  },
});
