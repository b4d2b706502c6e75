//! Namespace routes: list, create, load, head, drop, update properties.

use super::*;

pub(super) async fn list_namespaces(
    State(state): State<AppState>,
    Path(prefix): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_prefix(&state, &prefix)?;
    let parent = match query.get("parent").filter(|p| !p.is_empty()) {
        Some(p) => Some(Namespace::from_url(p)?),
        None => None,
    };
    let all = state.catalog.store().list_namespaces().await?;
    if let Some(parent) = &parent
        && !all.contains(parent)
    {
        return Err(ApiError::no_such_namespace(parent));
    }
    let children: Vec<Namespace> = all
        .into_iter()
        .filter(|ns| ns.is_child_of(parent.as_ref()))
        .collect();
    let (page, next) = paginate(children, |ns| ns.stored(), &query)?;
    let namespaces: Vec<&[String]> = page.iter().map(Namespace::parts).collect();
    Ok(Json(with_page_token(
        json!({ "namespaces": namespaces }),
        next,
    )))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateNamespaceBody {
    namespace: Vec<String>,
    #[serde(default)]
    properties: HashMap<String, String>,
}

pub(super) async fn create_namespace(
    State(state): State<AppState>,
    Path(prefix): Path<String>,
    JsonBody(body): JsonBody<CreateNamespaceBody>,
) -> ApiResult<Json<Value>> {
    check_prefix(&state, &prefix)?;
    let namespace = Namespace::from_parts(body.namespace)?;
    state
        .catalog
        .store()
        .create_namespace(&namespace, &body.properties)
        .await?;
    tracing::info!(%namespace, "created namespace");
    Ok(Json(json!({
        "namespace": namespace.parts(),
        "properties": body.properties,
    })))
}

pub(super) async fn load_namespace(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    let mut properties = state.catalog.namespace_properties(&namespace).await?;
    // Report where the namespace's tables go, as Hive-style catalogs do. Trino needs this to
    // choose a table location and create through stage-create.
    properties
        .entry("location".to_string())
        .or_insert_with(|| state.catalog.warehouse().namespace_location(&namespace));
    Ok(Json(json!({
        "namespace": namespace.parts(),
        "properties": properties,
    })))
}

pub(super) async fn head_namespace(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    state.catalog.namespace_properties(&namespace).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn drop_namespace(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    state.catalog.store().drop_namespace(&namespace).await?;
    tracing::info!(%namespace, "dropped namespace");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UpdatePropertiesBody {
    #[serde(default)]
    removals: Vec<String>,
    #[serde(default)]
    updates: HashMap<String, String>,
}

pub(super) async fn update_namespace_properties(
    State(state): State<AppState>,
    Path((prefix, namespace)): Path<(String, String)>,
    JsonBody(body): JsonBody<UpdatePropertiesBody>,
) -> ApiResult<Json<Value>> {
    let namespace = namespace_of(&state, &prefix, &namespace)?;
    if let Some(both) = body.removals.iter().find(|k| body.updates.contains_key(*k)) {
        return Err(ApiError::new(
            ErrorType::Unprocessable,
            format!("property {both:?} is both removed and updated"),
        ));
    }
    let before = state.catalog.namespace_properties(&namespace).await?;
    state
        .catalog
        .store()
        .update_namespace_properties(&namespace, &body.removals, &body.updates)
        .await?;
    let (removed, missing): (Vec<&String>, Vec<&String>) =
        body.removals.iter().partition(|k| before.contains_key(*k));
    let updated: Vec<&String> = body.updates.keys().collect();
    Ok(Json(
        json!({ "updated": updated, "removed": removed, "missing": missing }),
    ))
}

// ---------------------------------------------------------------------------------------------
// Tables
