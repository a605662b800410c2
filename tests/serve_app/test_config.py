"""The app config fails at load, naming the field; every shipped config validates."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from serve_app.builder import build_app, deployment_options
from serve_app.config import AppConfig

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def model(**kw):
    return {"name": "m", "model": "smollm2-135m-instruct", **kw}


@pytest.mark.parametrize("args,field", [
    ({"models": []}, "models"),
    ({"models": [model(lookahead={"branch_length": 0})]}, "models.0.lookahead.branch_length"),
    ({"models": [model(lookahead={"decoding_mode": "tree"})]}, "models.0.lookahead.decoding_mode"),
    ({"models": [model(lookahead={"decodng_length": 3})]}, "models.0.lookahead.decodng_length"),
    ({"models": [model(batching={"max_batch_size": 32, "max_tokens_per_step": 16})]}, "models.0.batching"),
    ({"models": [model(dtype="int3")]}, "models.0.dtype"),
    ({"models": [model(name="bad name!")]}, "models.0.name"),
    ({"models": [model(limits={"default_max_tokens": 2000, "max_new_tokens": 100})]}, "models.0.limits"),
    ({"models": [model(deployment={"num_replicas": 2, "autoscaling_config": {"max_replicas": 3}})]},
     "models.0.deployment"),
    ({"models": [model(), model()]}, "models"),
])
def test_invalid_config_names_the_field(args, field):
    with pytest.raises(ValidationError) as info:
        AppConfig.model_validate(args)
    locs = [".".join(str(p) for p in e["loc"]) for e in info.value.errors()]
    assert any(loc == field or (loc == "" and field == "models") for loc in locs), locs


def test_lookahead_bounds_default_to_the_settings():
    la = AppConfig.model_validate({"models": [model(lookahead={"decoding_length": 32})]}).models[0].lookahead
    assert la.decoding_length_bound == 32 and la.branch_length_bound == 12
    with pytest.raises(ValidationError, match="max_decoding_length"):
        AppConfig.model_validate({"models": [model(lookahead={"decoding_length": 32, "max_decoding_length": 16})]})


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_validate_and_build(path):
    cfg = yaml.safe_load(path.read_text())
    for app in cfg["applications"]:
        assert app["import_path"] == "serve_app.builder:build_app"
        args = AppConfig.model_validate(app["args"])
        build_app(args)  # builds the deployment graph without starting anything
        for m in args.models:
            opts = deployment_options(m)
            if m.deployment.autoscaling_config is not None:
                assert opts["autoscaling_config"]["policy"]["policy_function"] == "serve_app.autoscaling:engine_queue_policy"


def test_placement_knobs_reach_ray():
    args = AppConfig.model_validate({
        "models": [model(deployment={"num_replicas": 4, "max_replicas_per_node": 1,
                                     "ray_actor_options": {"num_cpus": 1, "resources": {"gpu_node": 1}}})],
        "ingress": {"resources": {"node:__internal_head__": 0.001}}})
    opts = deployment_options(args.models[0])
    assert opts["max_replicas_per_node"] == 1 and opts["ray_actor_options"]["resources"] == {"gpu_node": 1}
    assert "max_replicas_per_node" not in deployment_options(AppConfig.model_validate({"models": [model()]}).models[0])
    ingress = build_app(args)._bound_deployment
    assert ingress.ray_actor_options["resources"] == {"node:__internal_head__": 0.001}
    assert ingress._deployment_config.graceful_shutdown_timeout_s == 300  # outlasts the generations it streams
    with pytest.raises(ValidationError, match="max_replicas_per_node"):
        AppConfig.model_validate({"models": [model(deployment={"max_replicas_per_node": 0})]})


def test_routing_defaults_to_prefix_affinity_through_rays_router():
    from serve_app.prefix_router import ROUTER_PATH

    m = AppConfig.model_validate({"models": [model(batching={"max_batch_size": 8})]}).models[0]
    assert m.routing == "prefix_affinity" and m.lookahead.shared_memory
    rc = deployment_options(m)["request_router_config"]
    assert rc.request_router_class == ROUTER_PATH
    assert rc.request_router_kwargs == {"imbalanced_threshold": 8}  # None: a whole batch of difference
    m = AppConfig.model_validate({"models": [model(routing_imbalance=2)]}).models[0]
    assert deployment_options(m)["request_router_config"].request_router_kwargs == {"imbalanced_threshold": 2}
    pow2 = AppConfig.model_validate({"models": [model(routing="pow2")]}).models[0]
    assert "request_router_config" not in deployment_options(pow2)  # Serve's own power of two choices
    for bad, field in [({"routing": "random"}, "models.0.routing"), ({"routing_imbalance": -1}, "models.0.routing_imbalance"),
                       ({"lookahead": {"shared_memory_sync_s": 0}}, "models.0.lookahead.shared_memory_sync_s")]:
        with pytest.raises(ValidationError) as info:
            AppConfig.model_validate({"models": [model(**bad)]})
        assert field in [".".join(str(p) for p in e["loc"]) for e in info.value.errors()]
