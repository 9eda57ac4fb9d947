// ONNX Runtime side of bench/run_bench.py: node ort_infer.js MODEL.onnx BATCH THREADS prints
// {"ms": median milliseconds per run} of 200 runs after 10 warm-up runs, random inputs.
const ort = require('onnxruntime-node');

(async () => {
  const [model, batch, threads] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
  const session = await ort.InferenceSession.create(model, {intraOpNumThreads: threads, interOpNumThreads: 1});
  const feeds = {};
  for (const name of session.inputNames) {
    const dims = name === 'x' && model.includes('cnn') ? [batch, 1, 28, 28] : [batch, 784];
    const data = Float32Array.from({length: dims.reduce((a, b) => a * b)}, () => Math.random());
    feeds[name] = new ort.Tensor('float32', data, dims);
  }
  for (let i = 0; i < 10; i++) await session.run(feeds);
  const ms = [];
  for (let i = 0; i < 200; i++) {
    const start = process.hrtime.bigint();
    await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  ms.sort((a, b) => a - b);
  console.log(JSON.stringify({ms: ms[Math.floor(ms.length / 2)]}));
})();
