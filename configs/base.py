r"""The shared defaults every config starts from (Fashion-MNIST CNN, SimiGrad + AdaScale).

    python launch/train.py --config=configs/base.py --workdir=workdir/base

Fields (every one is validated by `tf_adabatch.app.validate_config`):
  seed                      data order and initialisation
  deterministic             bit-reproducible ops (tf.config.experimental.enable_op_determinism,
                            process-wide; slower): a resumed run then ends exactly where an
                            uninterrupted one does
  dataset                   fashion_mnist | digits | synthetic | python_text (byte windows
                            of 100 generated Python modules, seed-fixed, for the transformer)
  model                     cnn | mlp (images) | transformer (token sequences)
  strategy                  mirrored | one_device | multi_worker | tpu
  cluster                   multi_worker only: how the workers find each other:
                            tf_config (TF_CONFIG; Kubernetes TFJob) | slurm (srun's environment)
  slurm_port_base           cluster=slurm: port of a node's first task (task i: base + i)
  num_cpu_replicas          mirrored without GPUs: logical CPU devices to simulate
  micro_batch_size          examples per replica per micro-step
  base_batch_size           B0: the batch the learning rate and schedule are tuned for
  similarity                exact (group cosine) | estimated (from scalars: replica norms)
  policy.kind               static | simigrad | noise_scale | goodput | critical_warmup |
                            norm_test | seesaw
  policy.initial_batch_size / min_batch_size / max_batch_size   global batch sizes
  policy.target_similarity, step, interval, smoothing           SimiGrad controller
  policy.factor             noise_scale: batch = factor x noise scale
  policy.hysteresis         goodput: relative gain in predicted progress per second needed
                            to change the batch (pair goodput with lr.rule=adascale)
  policy.margin, growth_factor  critical_warmup: multiply the batch by growth_factor when
                            the smoothed noise scale >= margin x the grown batch; never shrink
                            (Merrill et al. 2025; pair with adascale, or sqrt for Adam)
  policy.theta              norm_test: grow to the smallest batch with B >= noise scale /
                            theta^2 (Byrd et al. 2012, AdAdaGrad); never shrink
                            seesaw: the batch grows by growth_factor at each of
                            lr.decay_fractions of the budget (Meterez et al. 2025); pair with
                            lr.schedule=step, lr.decay_factor=1/growth_factor, lr.rule=sqrt
  optimizer.name            sgd | adamw (pair adamw with lr.gain_power=0.5)
  optimizer.learning_rate   base learning rate at B0; momentum, nesterov: SGD
  optimizer.weight_decay    Keras's decoupled weight decay (0: none)
  lr.rule                   adascale | sqrt | linear | none
  lr.schedule               cosine (over the base run) | constant | step (x lr.decay_factor
                            at each of lr.decay_fractions of the budget)
  lr.gain_power             1 (SGD); 0.5 for Adam-like optimizers
  lr.warmup_base_epochs     linear rule only: warm-up length
  train.base_epochs         the budget: epochs at the base batch (progress tau)
  train.max_steps           optional cap on optimizer steps (None: no cap)
  train.checkpoint_every_steps, eval_every_base_epochs, eval_batch_size
  train.max_consecutive_skips  stop after this many non-finite steps in a row (None: never;
                            on the command line `--config.train.max_consecutive_skips=None`)
  train.steps_per_execution  optimizer steps per call of the step, run in a loop on the
                            device (Keras's steps_per_execution; 1: one host read per step).
                            Evaluations, checkpoints, the preemption save and the progress
                            bar then act at a block's end (a checkpoint at the block's last
                            step once the block passed a multiple of checkpoint_every_steps)
  train.rollback            copy: a step whose update is not finite is undone from a copy of
                            the weights and optimizer slots kept every step (the default) |
                            stop: no copy (less memory: 1/3 of the engine's variables with
                            SGD + momentum); such a step ends the run with exit 3, naming the
                            last checkpoint to resume from
  train.divergence_factor   no checkpoint while the last step's loss is above the first
                            checkpoint interval's mean and this many times the best
                            interval's mean (exploding); a run that ends so exits 3
                            (None: never)
  clock.profile             None: each step's time is this host's (the default); a measured
                            GPU profile of configs/profiles (e.g. cifar10_resnet18_t4, from
                            `python launch/fit_profiles.py`): the run trains here for real
                            and every step is charged what the profile predicts on
                            clock.devices GPUs (a virtual clock: step_time, train_seconds,
                            the goodput policy's timings; metrics.json names the clock)
  clock.devices             the virtual clock's GPUs N (the global batch split over them)
  train.preemption          SIGTERM (SLURM, Kubernetes, spot VMs) saves a checkpoint at the
                            optimizer step all workers agree on, then launch/train.py exits
                            143 (rerun to resume); False: SIGTERM kills the job as usual
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.seed = 0
    config.deterministic = False
    config.dataset = "fashion_mnist"
    config.model = "cnn"
    config.strategy = "mirrored"
    config.cluster = "tf_config"
    config.slurm_port_base = 8888
    config.num_cpu_replicas = 4
    config.micro_batch_size = 32
    config.base_batch_size = 128
    config.similarity = "exact"

    config.policy = config_dict.ConfigDict()
    config.policy.kind = "simigrad"
    config.policy.initial_batch_size = 128
    config.policy.min_batch_size = 128
    config.policy.max_batch_size = 2048
    config.policy.target_similarity = 0.5
    config.policy.step = 0.1
    config.policy.interval = 1
    config.policy.smoothing = config_dict.placeholder(float)
    config.policy.factor = 1.0
    config.policy.hysteresis = 0.05
    config.policy.margin = 1.0
    config.policy.growth_factor = 2
    config.policy.theta = 1.0

    config.optimizer = config_dict.ConfigDict()
    config.optimizer.learning_rate = 0.05
    config.optimizer.momentum = 0.9
    config.optimizer.nesterov = False
    config.optimizer.name = "sgd"
    config.optimizer.weight_decay = 0.0

    config.lr = config_dict.ConfigDict()
    config.lr.rule = "adascale"
    config.lr.schedule = "cosine"
    config.lr.gain_power = 1.0
    config.lr.warmup_base_epochs = 0.0
    config.lr.decay_fractions = (0.5, 0.75)
    config.lr.decay_factor = 0.5

    config.train = config_dict.ConfigDict()
    config.train.base_epochs = 10.0
    config.train.max_steps = config_dict.placeholder(int)
    config.train.checkpoint_every_steps = 100
    config.train.eval_every_base_epochs = 1.0
    config.train.eval_batch_size = 1000
    config.train.max_consecutive_skips = config_dict.FieldReference(100, field_type=int)
    config.train.divergence_factor = config_dict.FieldReference(10.0, field_type=float)
    config.train.preemption = True
    config.train.steps_per_execution = 1
    config.train.rollback = "copy"

    config.clock = config_dict.ConfigDict()
    config.clock.profile = config_dict.placeholder(str)
    config.clock.devices = 1
    return config
